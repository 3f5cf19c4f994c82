"""Expanding `sweep:` and `variants:` into points: order, ids, the `policy.` prefix, and errors."""

from __future__ import annotations

import copy
import re
import time

import pytest

from experiments import sweep as sweep_module
from experiments.sweep import count_values, expand
from simcore.errors import ConfigError
from tests.helpers import HANG_S

SOURCE = "exp.yaml"


def base(**extra) -> dict:
    data = {
        "name": "tiny",
        "workload": {
            "num_requests": 10,
            "arrivals": {"kind": "poisson", "rate": 4.0},
            "prompt_len": {"kind": "fixed", "value": 64},
            "output_len": {"kind": "fixed", "value": 8},
        },
        "policies": [{"name": "continuous"}, {"name": "chunked_prefill", "chunk_size": 256}],
    }
    data.update(extra)
    return data


def test_product_is_first_key_outermost():
    plan = expand(base(sweep={"policy.max_num_seqs": [8, 16], "workload.arrivals.rate": [1, 2, 3]}), source=SOURCE)
    assert plan.mode == "product"
    assert plan.keys == ["policy.max_num_seqs", "workload.arrivals.rate"]
    assert [tuple(p.values.values()) for p in plan.points] == [(8, 1), (8, 2), (8, 3), (16, 1), (16, 2), (16, 3)]
    last = plan.points[-1].experiment
    assert last.workload.arrivals.rate == 3
    assert [p.max_num_seqs for p in last.policies] == [16, 16]
    assert all(p.experiment.sweep is None and p.experiment.variants is None for p in plan.points)


def test_zip_pairs_values_and_needs_equal_lengths():
    plan = expand(base(sweep={"mode": "zip", "seed": [1, 2], "workload.arrivals.rate": [5, 6]}), source=SOURCE)
    assert [(p.experiment.seed, p.experiment.workload.arrivals.rate) for p in plan.points] == [(1, 5), (2, 6)]
    with pytest.raises(ConfigError, match=r"exp\.yaml: sweep: .*same length.*seed: 2, workload.arrivals.rate: 3"):
        expand(base(sweep={"mode": "zip", "seed": [1, 2], "workload.arrivals.rate": [1, 2, 3]}), source=SOURCE)


def test_unknown_mode_and_non_list_values_are_errors():
    with pytest.raises(ConfigError, match="unknown sweep mode.*'grid'"):
        expand(base(sweep={"mode": "grid", "seed": [1]}), source=SOURCE)
    with pytest.raises(ConfigError, match="sweep: seed: a swept key needs a non-empty list"):
        expand(base(sweep={"seed": 3}), source=SOURCE)


def test_variants_are_outer_and_share_the_workload():
    plan = expand(base(sweep={"policy.max_num_seqs": [8, 16]},
                       variants={"bf16": {}, "small-blocks": {"kv_cache.block_size": 8}}), source=SOURCE)
    assert plan.variants == ["bf16", "small-blocks"]
    assert [(p.variant, p.values["policy.max_num_seqs"]) for p in plan.points] == [
        ("bf16", 8), ("bf16", 16), ("small-blocks", 8), ("small-blocks", 16)]
    assert [p.experiment.kv_cache.block_size for p in plan.points] == [16, 16, 8, 8]
    workloads = {p.experiment.workload.model_dump_json() for p in plan.points}
    assert len(workloads) == 1 and len({p.experiment.seed for p in plan.points}) == 1


def test_policy_prefix_reaches_only_policies_with_the_field():
    plan = expand(base(sweep={"policy.chunk_size": [128, 512]}), source=SOURCE)
    for point, size in zip(plan.points, (128, 512), strict=True):
        continuous, chunked = point.experiment.policies
        assert chunked.chunk_size == size
        assert not hasattr(continuous, "chunk_size")
    one = expand(base(sweep={"policies.0.max_num_seqs": [4]}), source=SOURCE).points[0].experiment
    assert [p.max_num_seqs for p in one.policies] == [4, 256]


def test_point_ids_are_stable_and_follow_the_configuration():
    data = base(sweep={"workload.arrivals.rate": [1, 2]})
    first = [p.point_id for p in expand(copy.deepcopy(data), source=SOURCE).points]
    again = [p.point_id for p in expand(copy.deepcopy(data), source=SOURCE).points]
    assert first == again
    assert all(re.fullmatch(r"\d{4}-[0-9a-f]{10}", pid) for pid in first)
    assert len(set(first)) == 2
    # Spelling out a default does not change the point; changing the base does.
    spelled = copy.deepcopy(data)
    spelled["seed"] = 0
    assert [p.point_id for p in expand(spelled, source=SOURCE).points] == first
    data["workload"]["num_requests"] = 11
    assert [p.point_id for p in expand(data, source=SOURCE).points] != first


@pytest.mark.parametrize(
    ("sweep", "pattern"),
    [
        ({"workload.arrivals.rat": [1]}, r"exp\.yaml: sweep key 'workload\.arrivals\.rat'.*unknown key.*'rate'"),
        ({"workload.arrivals.rate": [2, -1]}, r"exp\.yaml: sweep key 'workload\.arrivals\.rate': value -1"),
        ({"policy.chunk_sz": [1]}, r"exp\.yaml: sweep key 'policy\.chunk_sz'.*did you mean 'chunk_size'"),
        ({"policies.5.chunk_size": [1]}, r"exp\.yaml: sweep key 'policies\.5\.chunk_size'.*index"),
        ({"workload.arrivals.rate.x": [1]}, r"exp\.yaml: sweep key 'workload\.arrivals\.rate\.x'"),
    ],
)
def test_bad_sweep_paths_name_the_key_and_the_file(sweep, pattern):
    with pytest.raises(ConfigError, match=pattern):
        expand(base(sweep=sweep), source=SOURCE)


def test_bad_variant_names_the_variant():
    with pytest.raises(ConfigError, match=r"exp\.yaml: variant 'fast': kv_cache\.blok_size"):
        expand(base(variants={"ok": {}, "fast": {"kv_cache.blok_size": 8}}), source=SOURCE)


def test_overrides_valid_only_together_are_accepted():
    plan = expand(base(variants={"gamma": {"workload.arrivals.kind": "gamma", "workload.arrivals.cv": 2.0}}),
                  source=SOURCE)
    assert plan.points[0].experiment.workload.arrivals.cv == 2.0


def test_no_sweep_is_one_point():
    plan = expand(base(), source=SOURCE)
    assert len(plan.points) == 1 and plan.points[0].values == {} and plan.points[0].title == "base"


# --- size limits: checked before any point is built -----------------------------------------------


def test_a_grid_past_the_point_limit_is_refused_before_it_is_built():
    # 100**10 combinations: itertools.product would never finish; the count is refused at once.
    keys = ["seed", "workload.arrivals.rate", "workload.num_requests", "workload.prompt_len.value",
            "workload.output_len.value", "policy.max_num_seqs", "policy.max_num_batched_tokens", "policy.watermark",
            "kv_cache.block_size", "metrics.delivery_ms"]
    sweep = {key: list(range(1, 101)) for key in keys}
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"exp\.yaml: sweep: this sweep has too many points \(100 x 100 x .* = "
                                          r"100,000,000,000,000,000,000\); expected at most 10,000 points"):
        expand(base(sweep=sweep), source=SOURCE)
    assert time.perf_counter() - started < HANG_S


def test_the_point_limit_counts_variants_times_combinations(monkeypatch):
    monkeypatch.setattr(sweep_module, "MAX_SWEEP_POINTS", 6)
    variants = {"a": {}, "b": {"kv_cache.block_size": 8}}
    assert len(expand(base(sweep={"seed": [1, 2, 3]}, variants=variants), source=SOURCE).points) == 6
    with pytest.raises(ConfigError, match=r"too many points \(2 x 4 = 8\)"):
        expand(base(sweep={"seed": [1, 2, 3, 4]}, variants=variants), source=SOURCE)
    with pytest.raises(ConfigError, match=r"exp\.yaml: variants: this sweep has too many points \(7 = 7\)"):
        expand(base(variants={f"v{i}": {} for i in range(7)}), source=SOURCE)


def test_copies_of_a_large_experiment_are_bounded():
    # 100,000 values in the base, copied into each of 300 points: 30M values, past the 20M allowed.
    data = base(sweep={"seed": list(range(300))})
    data["workload"]["prompt_len"] = {"kind": "empirical", "values": list(range(1, 100_001))}
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"exp\.yaml: sweep: this sweep would copy too much: its 300 points each "
                                          r"hold a copy of the experiment, which has more than 66,666 values"):
        expand(data, source=SOURCE)
    assert time.perf_counter() - started < HANG_S
    data["sweep"] = {"seed": [1, 2]}  # the same experiment over a few points is fine
    assert len(expand(data, source=SOURCE).points) == 2


def test_count_values_stops_early():
    shared = [1] * 10
    for _ in range(12):
        shared = [shared] * 10  # 10**13 values written out
    # The mapping, its 2 keys, the list and its 2 items, the inner mapping, its key and value.
    assert count_values({"a": [1, 2], "b": {"c": 3}}, stop=100) == 9
    assert count_values(shared, stop=1000) == 1001


def test_messages_and_titles_never_print_a_large_value():
    big = list(range(100_000))
    long_text = "x" * 100_000
    with pytest.raises(ConfigError) as err:
        expand(base(sweep={"seed": [big]}), source=SOURCE)
    assert len(str(err.value)) < 500 and "sweep key 'seed': value [0, 1, 2, 3, 4, 5, ...]" in str(err.value)
    with pytest.raises(ConfigError) as err:
        expand(base(sweep={"name": [long_text], "seed": [big]}), source=SOURCE)
    assert len(str(err.value)) < 500
    plan = expand(base(sweep={"description": [long_text, "short"]}), source=SOURCE)
    assert len(plan.points[0].title) <= 130 and plan.points[1].title == "description=short"
