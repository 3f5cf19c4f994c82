"""Expanding an experiment's `sweep:` and `variants:` into points, each a whole validated Experiment.

    sweep:
      mode: product                       # or zip (every list the same length)
      policy.max_num_seqs: [32, 64]       # `policy.` = every entry of `policies:` that has the field
      policies.1.chunk_size: [256, 512]   # one policy by index
      workload.arrivals.rate: [2, 4, 8]
    variants:                             # named override sets, each crossed with the sweep
      fp8-kv: {kv_cache.dtype: fp8}
      small-blocks: {kv_cache.block_size: 8}

Points are ordered variants-outer, then the sweep in `product` order (first key outermost). A
point's id is its index plus a hash of its fully resolved configuration, so a resumed sweep
recognises finished points, and a point whose configuration changed is run again.

A sweep may have at most MAX_SWEEP_POINTS points (variants x combinations), and copy at most
MAX_SWEEP_VALUES values in all (points x the values of the experiment): both are checked before
any point is built, so a grid of 10**20 combinations is an error, not a hang.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from experiments.config import PolicyConfig, load_raw, parse_experiment, set_dotted
from simcore.errors import ConfigError, cut, short_repr

if TYPE_CHECKING:
    from experiments.config import Experiment

SWEEP_MODES = ("product", "zip")
POLICY_PREFIX = "policy."
# Most points a sweep may have: each is a whole simulation and a folder of results, and all are
# built and validated before the first runs (about 0.3 ms each for a small experiment).
MAX_SWEEP_POINTS = 10_000
# Most values (numbers, strings, list items, keys) all points together may copy: each point holds
# its own copy of the experiment. About 1 us and 25 bytes each: 20M take some 20 s and 0.5 GB,
# so a large `empirical` list is swept over tens of points, not thousands.
MAX_SWEEP_VALUES = 20_000_000


def _policy_models() -> dict[str, type[BaseModel]]:
    """Policy name -> its config model, read from the schema's tagged union (new policies included)."""
    union = typing.get_args(PolicyConfig)[0]
    return {typing.get_args(m.model_fields["name"].annotation)[0]: m for m in typing.get_args(union)}


POLICY_MODELS = _policy_models()


@dataclass(frozen=True)
class SweepPoint:
    index: int
    point_id: str
    variant: str | None
    # Swept path -> value, in the order of `sweep:` (the user's keys, `policy.` prefix kept).
    values: dict[str, Any]
    # The whole experiment mapping with the variant and sweep values applied (no sweep/variants).
    data: dict[str, Any]
    experiment: Experiment

    @property
    def title(self) -> str:
        """A short human name: 'variant | key=value, key=value' (long values cut short)."""
        parts = ", ".join(f"{k}={_value_text(v)}" for k, v in self.values.items())
        if self.variant is None:
            return parts or "base"
        return f"{self.variant} | {parts}" if parts else self.variant


@dataclass(frozen=True)
class SweepPlan:
    source: str | None
    name: str
    mode: str
    keys: list[str]
    variants: list[str]
    points: list[SweepPoint]

    def manifest(self) -> dict[str, Any]:
        """What `sweep.json` records: enough for reports to know the axes without re-reading the YAML."""
        return {
            "name": self.name, "source": self.source, "mode": self.mode, "keys": self.keys,
            "variants": self.variants,
            "points": [{"index": p.index, "point_id": p.point_id, "variant": p.variant, "values": p.values}
                       for p in self.points],
        }


def load_sweep(path: str | Path, overrides: list[str] | None = None) -> SweepPlan:
    """Read an experiment file, apply `--set` overrides, and expand its sweep into points."""
    return expand(load_raw(path, overrides), source=str(path))


def expand(data: dict[str, Any], *, source: str | None) -> SweepPlan:
    """Every (variant x sweep combination) as a validated point; errors name the sweep key or variant."""
    base = copy.deepcopy(data)
    sweep = base.pop("sweep", None) or {}
    variants = base.pop("variants", None) or {}
    # The base alone must be valid: its errors are the file's, not a sweep key's.
    parse_experiment(copy.deepcopy(base), source=source)
    mode, axes = _parse_sweep(sweep, source)
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise ConfigError("variants must map a name to {dotted.path: value}", source=source, where="variants")
    keys = list(axes)
    variant_items: list[tuple[str | None, dict[str, Any]]] = list(variants.items()) or [(None, {})]
    _check_size(base, axes, mode, len(variant_items), source)
    combos = _combinations(axes, mode)
    points: list[SweepPoint] = []
    for variant, variant_overrides in variant_items:
        variant_base = _with_variant(base, variant, variant_overrides, source)
        for combo in combos:
            values = dict(zip(keys, combo, strict=True))
            index = len(points)
            point_data = _with_values(variant_base, values, variant, source)
            exp = parse_experiment(copy.deepcopy(point_data), source=source)
            points.append(SweepPoint(index, point_id(index, exp), variant, values, point_data, exp))
    name = str(base.get("name", "experiment"))
    return SweepPlan(source, name, mode, keys, [v for v, _ in variant_items if v is not None], points)


def point_id(index: int, exp: Experiment) -> str:
    """Index plus a hash of the resolved configuration (defaults filled in, so spelling does not matter)."""
    canonical = json.dumps(exp.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return f"{index:04d}-{hashlib.sha256(canonical.encode()).hexdigest()[:10]}"


def _check_size(base: dict, axes: dict[str, list[Any]], mode: str, num_variants: int, source: str | None) -> None:
    """Refuse a sweep past MAX_SWEEP_POINTS points or MAX_SWEEP_VALUES copied values, before any is built."""
    lengths = [len(values) for values in axes.values()]
    num_combos = (lengths[0] if mode == "zip" else math.prod(lengths)) if lengths else 1
    num_points = num_combos * num_variants
    if num_points > MAX_SWEEP_POINTS:
        shape = " x ".join(str(n) for n in ([num_variants] if num_variants > 1 else []) + lengths[:8])
        if len(lengths) > 8:
            shape += " x ..."
        raise ConfigError(f"this sweep has too many points ({shape} = {num_points:,})", source=source,
                          where="sweep" if num_combos > 1 else "variants",
                          expected=f"at most {MAX_SWEEP_POINTS:,} points (variants x combinations of the swept values)")
    budget = MAX_SWEEP_VALUES // num_points
    size = count_values(base, stop=budget)
    if size > budget:
        raise ConfigError(f"this sweep would copy too much: its {num_points:,} points each hold a copy of the "
                          f"experiment, which has more than {budget:,} values", source=source, where="sweep",
                          expected=f"at most {MAX_SWEEP_VALUES:,} values in all points together (fewer points, or "
                                   "a smaller experiment, e.g. a shorter `empirical` list)")


def count_values(data: Any, *, stop: int) -> int:
    """Values in `data` (each scalar, list item and mapping key and value counts), counting
    no further than just past `stop`: the work is bounded whatever the data's size."""
    count = 0
    stack = [data]
    while stack and count <= stop:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return count


def _parse_sweep(sweep: Any, source: str | None) -> tuple[str, dict[str, list[Any]]]:
    if not isinstance(sweep, dict):
        raise ConfigError("sweep must map dotted paths to lists of values", source=source, where="sweep",
                          found=type(sweep).__name__)
    axes = dict(sweep)
    mode = axes.pop("mode", "product")
    if mode not in SWEEP_MODES:
        raise ConfigError("unknown sweep mode", source=source, where="sweep.mode",
                          expected=" or ".join(SWEEP_MODES), found=mode, choices=SWEEP_MODES)
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ConfigError("a swept key needs a non-empty list of values", source=source,
                              where=f"sweep: {_key_text(key)}", found=values)
    if mode == "zip" and len({len(v) for v in axes.values()}) > 1:
        lengths = ", ".join(f"{k}: {len(v)}" for k, v in axes.items())
        raise ConfigError(f"mode zip pairs values position by position, so every list needs the same length "
                          f"(got {lengths})", source=source, where="sweep")
    return mode, axes


def _combinations(axes: dict[str, list[Any]], mode: str) -> list[tuple[Any, ...]]:
    if not axes:
        return [()]
    if mode == "zip":
        return list(zip(*axes.values(), strict=True))
    return list(itertools.product(*axes.values()))


def _with_variant(base: dict, variant: str | None, overrides: dict[str, Any], source: str | None) -> dict:
    if variant is None:
        return copy.deepcopy(base)
    return _apply(base, {str(k): v for k, v in overrides.items()}, source,
                  where_one=lambda key: f"variant {short_repr(variant)}: {_key_text(key)}",
                  where_all=f"variant {short_repr(variant)}")


def _with_values(variant_base: dict, values: dict[str, Any], variant: str | None, source: str | None) -> dict:
    combo = ", ".join(f"{_key_text(k)}={short_repr(v)}" for k, v in values.items())
    where_all = f"variant {short_repr(variant)}, sweep point {combo}" if variant else f"sweep point {combo}"
    return _apply(variant_base, values, source, where_one=lambda key: f"sweep key {short_repr(key)}",
                  where_all=where_all)


def _value_text(value: Any, limit: int = 100) -> str:
    """str(value) for a title, cut to `limit` characters; a large list or mapping is not written out."""
    if isinstance(value, (dict, list, tuple)) and count_values(value, stop=limit) > limit:
        return short_repr(value, limit)
    return cut(str(value), limit)


def _key_text(key: Any) -> str:
    """A sweep or variant key as written, cut short for messages."""
    return cut(key, 100) if isinstance(key, str) else short_repr(key)


def _apply(base: dict, overrides: dict[str, Any], source: str | None, *, where_one: Callable[[str], str],
           where_all: str) -> dict:
    """`base` with every override set, validated; an error names the one override that alone breaks it."""
    data = copy.deepcopy(base)
    for key, value in overrides.items():
        try:
            _set(data, key, value)
        except ConfigError as exc:
            raise ConfigError(f"value {short_repr(value)}: {exc}", source=source, where=where_one(key)) from None
    try:
        parse_experiment(copy.deepcopy(data), source=None)
    except ConfigError as exc:
        # Overrides may only be valid together (a new arrival kind and its rate), so try each alone
        # before blaming the combination.
        for key, value in overrides.items():
            alone = copy.deepcopy(base)
            _set(alone, key, value)
            try:
                parse_experiment(alone, source=None)
            except ConfigError as single:
                raise ConfigError(f"value {short_repr(value)}: {single}", source=source,
                                  where=where_one(key)) from None
        raise ConfigError(str(exc), source=source, where=where_all) from None
    return data


def _set(data: dict, path: str, value: Any) -> None:
    """set_dotted, with `policy.` fanned out to every policy that has the field."""
    for target in _targets(data, path):
        try:
            set_dotted(data, target, copy.deepcopy(value), source=None)
        except (TypeError, AttributeError, KeyError):
            # set_dotted walks into whatever it finds; a scalar on the way is a bad path.
            raise ConfigError("the path goes through a value that is not a mapping or list",
                              where=target) from None


def _targets(data: dict, path: str) -> list[str]:
    if not path.startswith(POLICY_PREFIX):
        return [path]
    rest = path[len(POLICY_PREFIX):]
    field = rest.split(".")[0]
    policies = data.get("policies")
    if not isinstance(policies, list) or not policies:
        raise ConfigError("`policy.` applies to every entry of `policies:`, but there is none", where=path)
    targets = [f"policies.{i}.{rest}" for i, p in enumerate(policies) if _accepts(p, field)]
    if not targets:
        known = sorted({f for m in POLICY_MODELS.values() for f in m.model_fields})
        raise ConfigError("no policy of this experiment has this field", where=path,
                          expected=f"one of {known}", found=field, choices=known)
    return targets


def _accepts(policy: Any, field: str) -> bool:
    model = POLICY_MODELS.get(policy.get("name")) if isinstance(policy, dict) else None
    # An unknown policy name is left to validation, which reports it better than we could here.
    return model is None or field in model.model_fields
