"""A cost model fitted to step times measured on real hardware (`servesim profile` writes the table).

The table is a CSV with `# key: value` header comments (device, dtype, torch, model geometry as
JSON, block size) and one row per profiled step shape: the shape's descriptors and its median
time. We fit, with non-negative least squares on relative error, the sum of physically meaningful
parts of a step:

  t = c0                                     fixed cost: launches, scheduling, host preparation
    + g(N)                                   the GEMMs over N processed tokens: flat while the
                                             weights' memory reads dominate, then linear once
                                             compute bound; a convex piecewise-linear curve
                                             (hinges at fixed knots, non-negative slopes)
    + a * sum_prefill (q_i*c_i + q_i(q_i+1)/2)  prefill attention: query-key pairs
    + b * sum_decode (c_i + 1)               decode attention: keys read from the KV cache
    + s * num_seqs + l * num_selecting       per-request overhead, lm_head + sampling rows
    + e * prefill_pieces                     per multi-token piece: its own attention call per
                                             layer (several prompts in one step pay it each)
    + e' * continued pieces                  a piece after cached context: gather + masked path
    + k * sum_prefill c_i                    ... which gathers that context's K/V
    + d * [any decode rows]                  the decode attention call (once per layer)

Non-negativity keeps every part physical (no negative attention cost compensating a GEMM
overestimate), which is what lets the fit extrapolate to mixed steps and long contexts.
Imports no torch: the simulator uses profiled tables on machines without it.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from backends.base import CostContext
from simcore.errors import ConfigError
from simcore.paths import path_beside
from simcore.plan import Repeat, StepPlan

# Shape descriptors, in the order the CSV carries them (time_s follows).
SHAPE_COLUMNS = (
    "num_seqs", "num_prefill_tokens", "num_decode_tokens", "sum_context", "max_context",
    "sum_prefill_context", "sum_prefill_causal", "sum_decode_context", "num_selecting",
)
REQUIRED_COLUMNS = ("kind", *SHAPE_COLUMNS, "time_s")
# Descriptors added later: written by the profiler, derived as well as they can be when a table
# lacks them (exactly, for the grids older profilers wrote: one prefill piece per step).
OPTIONAL_SHAPE_COLUMNS = ("num_prefill_continuations",)
# Hinge knots (processed tokens per step) of the GEMM curve; those inside the data range are used.
KNOTS = (32, 128, 512, 2048, 8192, 32768)
# Model geometry fields that must agree between the table and the simulated model (a table
# recorded before a field existed is not checked on it). Mixtral 8x7B shares every dense field
# with Mistral 7B: the expert counts tell them apart.
GEOMETRY = ("num_layers", "hidden_size", "num_q_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size",
            "num_experts", "num_experts_per_tok", "kv_lora_rank")


def plan_shape(plan: StepPlan) -> dict[str, float]:
    """A plan's shape descriptors (SHAPE_COLUMNS), the same quantities the profiler records."""
    row = dict.fromkeys((*SHAPE_COLUMNS, *OPTIONAL_SHAPE_COLUMNS), 0.0)
    contexts = plan.decodes.context_lens
    if contexts:  # decodes as columns: the sums the loop below would make (of integers: exact)
        row["num_seqs"] = row["num_decode_tokens"] = row["num_selecting"] = float(len(contexts))
        row["sum_context"] = row["sum_decode_context"] = float(sum(contexts))
        row["max_context"] = float(max(contexts))
    for s in plan.listed:
        c, q = s.context_len, s.num_new_tokens
        row["num_seqs"] += 1
        row["sum_context"] += c
        row["max_context"] = max(row["max_context"], c)
        if s.is_decode:
            row["num_decode_tokens"] += 1
            row["sum_decode_context"] += c
        else:
            row["num_prefill_tokens"] += q
            row["sum_prefill_context"] += q * c
            row["sum_prefill_causal"] += q * (q + 1) / 2
            row["num_prefill_continuations"] += 1 if c > 0 else 0
        row["num_selecting"] += 1 if s.selects_token else 0
    return row


def step_kind(shape: dict[str, float]) -> str:
    prefill, decode = shape["num_prefill_tokens"] > 0, shape["num_decode_tokens"] > 0
    return "mixed" if prefill and decode else "prefill" if prefill else "decode" if decode else "empty"


# --- the table file ------------------------------------------------------------------------


@dataclass
class ProfileTable:
    path: Path
    header: dict[str, str]
    rows: list[dict[str, float]]  # shape columns + time_s (kind kept as a string)

    @property
    def model_geometry(self) -> dict | None:
        return json.loads(self.header["model"]) if "model" in self.header else None


def write_profile(path: str | Path, header: dict[str, str], rows: list[dict]) -> None:
    """Write a table: header comments, then REQUIRED_COLUMNS plus any extra columns of the rows."""
    extras = [k for k in (rows[0] if rows else {}) if k not in REQUIRED_COLUMNS]
    out = io.StringIO()
    for key, value in header.items():
        out.write(f"# {key}: {value}\n")
    writer = csv.writer(out, lineterminator="\n")
    columns = [*REQUIRED_COLUMNS, *extras]
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_fmt(row[c]) for c in columns])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(out.getvalue())


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.6g}"
    return str(value)


def read_profile(path: str | Path) -> ProfileTable:
    """Parse a profile table; any defect is a ConfigError naming the file and line."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read profile table ({exc.strerror})", source=str(path)) from None
    header: dict[str, str] = {}
    columns: list[str] | None = None
    rows: list[dict[str, float]] = []
    for lineno, line in enumerate(lines, start=1):
        where = f"line {lineno}"
        if not line.strip():
            continue
        if line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep:
                header[key.strip()] = value.strip()
            continue
        fields = next(csv.reader([line]))
        if columns is None:
            columns = [f.strip() for f in fields]
            missing = [c for c in REQUIRED_COLUMNS if c not in columns]
            if missing:
                raise ConfigError("profile table lacks columns", source=str(path), where=where,
                                  expected=f"columns {list(REQUIRED_COLUMNS)}", found=",".join(columns))
            continue
        if len(fields) != len(columns):
            raise ConfigError(f"row has {len(fields)} fields, the header {len(columns)}", source=str(path), where=where)
        rows.append(_parse_row(dict(zip(columns, fields, strict=True)), path, where))
    if columns is None or not rows:
        raise ConfigError("profile table has no rows", source=str(path),
                          expected=f"a header line {','.join(REQUIRED_COLUMNS)} and measured rows")
    if "model" in header:
        try:
            json.loads(header["model"])
        except ValueError:
            raise ConfigError("the '# model:' header is not JSON", source=str(path), found=header["model"]) from None
    return ProfileTable(path, header, rows)


def _parse_row(raw: dict[str, str], path: Path, where: str) -> dict:
    row: dict = {"kind": raw["kind"].strip()}
    for name in (*SHAPE_COLUMNS, "time_s"):
        text = raw[name].strip()
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"column {name}: not a number", source=str(path), where=where, found=text) from None
        if not np.isfinite(value) or value < 0 or (name == "time_s" and value == 0):
            raise ConfigError(f"column {name}: expected a {'positive' if name == 'time_s' else 'non-negative'} "
                              "finite number", source=str(path), where=where, found=text)
        row[name] = value
    for name in OPTIONAL_SHAPE_COLUMNS:
        text = raw.get(name, "").strip()
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"column {name}: not a number", source=str(path), where=where, found=text) from None
        if not np.isfinite(value) or value < 0:
            raise ConfigError(f"column {name}: expected a non-negative finite number", source=str(path),
                              where=where, found=text)
        row[name] = value
    return row


# --- the fit -------------------------------------------------------------------------------


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 500) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson & Hanson's active-set method)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(m, n)
    for _ in range(max_iter):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if z[passive].min() > 0:
                x = z
                break
            # Step back to the boundary and drop the variables that hit zero.
            blocked = passive & (z <= 0)
            alpha = np.min(x[blocked] / (x[blocked] - z[blocked]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


def _tokens(row: dict) -> float:
    return row["num_prefill_tokens"] + row["num_decode_tokens"]


def _prefill_pieces(row: dict) -> float:
    """Requests in the step that are not decodes: prefill chunks (derived, so old tables still fit)."""
    return max(row["num_seqs"] - row["num_decode_tokens"], 0.0)


def _continuations(row: dict) -> float:
    """Prefill pieces after cached context (their K/V gathered, a lower-right causal mask)."""
    if "num_prefill_continuations" in row:
        return row["num_prefill_continuations"]
    return min(_prefill_pieces(row), 1.0) if row["sum_prefill_context"] > 0 else 0.0


def _prefill_context(row: dict) -> float:
    """Sum of the cached context in front of each prefill chunk (gathered from the pool)."""
    return max(row["sum_context"] - row["sum_decode_context"], 0.0)


@dataclass
class StepTimeFit:
    knots: tuple[float, ...]
    coef: np.ndarray = field(repr=False)

    @staticmethod
    def features(r: dict, knots: tuple[float, ...]) -> list[float]:
        """One row of the design matrix: the terms the coefficients multiply."""
        n = _tokens(r)
        return [
            1.0, n, *(max(0.0, n - k) for k in knots),
            r["sum_prefill_context"] + r["sum_prefill_causal"],
            r["sum_decode_context"] + r["num_decode_tokens"],
            r["num_seqs"], r["num_selecting"],
            _prefill_pieces(r), _continuations(r), _prefill_context(r),
            1.0 if r["num_decode_tokens"] > 0 else 0.0,
            # A step with a prompt piece runs the eager forward: with CUDA graphs for decode steps its
            # kernel launches cost a floor that decode steps do not pay (about 25 ms on the first H200
            # run, 16 or 1024 prompt tokens alike), which no non-negative decode term can express.
            1.0 if r["num_prefill_tokens"] > 0 else 0.0,
        ]

    @staticmethod
    def design(rows: list[dict], knots: tuple[float, ...]) -> np.ndarray:
        return np.asarray([StepTimeFit.features(r, knots) for r in rows], dtype=float)

    @classmethod
    def fit(cls, rows: list[dict]) -> StepTimeFit:
        tokens = [_tokens(r) for r in rows]
        knots = tuple(float(k) for k in KNOTS if min(tokens) < k < max(tokens))
        x = cls.design(rows, knots)
        y = np.asarray([r["time_s"] for r in rows], dtype=float)
        # Relative error: divide each row by its time. Column scaling keeps NNLS well conditioned.
        xw = x / y[:, None]
        scale = np.abs(xw).max(axis=0)
        scale[scale == 0] = 1.0
        coef = nnls(xw / scale, np.ones(len(rows))) / scale
        return cls(knots, coef)

    def predict(self, rows: list[dict]) -> np.ndarray:
        return self.design(rows, self.knots) @ self.coef

    def predict_one(self, row: dict) -> float:
        """One step's prediction as a plain left-to-right sum, so that the step path and the fast
        path (which price the same shapes) agree bit for bit, whatever BLAS does with a matrix."""
        total = 0.0
        for value, coef in zip(self.features(row, self.knots), self.coef_list, strict=True):
            total += value * coef
        return total

    def __post_init__(self) -> None:
        self.coef_list: list[float] = self.coef.tolist()  # Python floats: cheaper per step than numpy

    def terms(self) -> dict[str, float]:
        names = ["const_s", "per_token_s", *(f"per_token_above_{int(k)}_s" for k in self.knots),
                 "per_attention_pair_s", "per_kv_read_s", "per_seq_s", "per_selecting_s",
                 "per_prefill_piece_s", "per_continued_piece_s", "per_prefill_context_s", "decode_path_s",
                 "prefill_path_s"]
        return dict(zip(names, self.coef.tolist(), strict=True))


def relative_errors(fit: StepTimeFit, rows: list[dict]) -> np.ndarray:
    y = np.asarray([r["time_s"] for r in rows])
    return (fit.predict(rows) - y) / y


def holdout_report(rows: list[dict], every: int = 4) -> dict:
    """Cross-validated |relative error|: fold k (rows k, k+every, ...) is predicted by a fit on the rest.

    Besides the overall figures (keys num_train, num_test, median/p90/max_abs_rel_error), reports
    them by step kind (`by_kind`), and two extrapolation checks: mixed steps predicted by a fit on
    pure prefill and decode steps only (`mixed_from_pure`: do the parts add up?), and the longest
    contexts predicted by a fit on the shorter half (`long_from_short`).
    """
    if len(rows) < 4 or every < 2:
        return {"num_train": len(rows), "num_test": 0}
    predicted = np.full(len(rows), np.nan)
    for k in range(every):
        test = list(range(k, len(rows), every))
        train = [r for i, r in enumerate(rows) if i % every != k]
        if len(train) >= 3 and test:
            predicted[test] = StepTimeFit.fit(train).predict([rows[i] for i in test])
    measured = np.asarray([r["time_s"] for r in rows])
    kinds = np.asarray([r["kind"] for r in rows])
    keep = ~np.isnan(predicted)
    err = np.abs(predicted - measured) / measured
    out: dict = {"num_train": len(rows) - len(rows[::every]), "num_test": int(keep.sum()), "folds": every}
    out.update(_abs_stats(err[keep]))
    out["by_kind"] = {kind: {"count": int((keep & (kinds == kind)).sum()), **_abs_stats(err[keep & (kinds == kind)])}
                      for kind in ("decode", "prefill", "mixed") if (keep & (kinds == kind)).any()}
    pure = [r for r in rows if r["kind"] != "mixed"]
    mixed = [r for r in rows if r["kind"] == "mixed"]
    if len(pure) >= 3 and mixed:
        out["mixed_from_pure"] = {"count": len(mixed), **_abs_stats(np.abs(relative_errors(StepTimeFit.fit(pure), mixed)))}
    reach = np.asarray([_reach(r) for r in rows])
    cut = float(np.median(reach))
    short = [r for r, x in zip(rows, reach, strict=True) if x <= cut]
    long = [r for r, x in zip(rows, reach, strict=True) if x > cut]
    if len(short) >= 3 and long:
        out["long_from_short"] = {"count": len(long), "fit_max_context": int(cut),
                                  **_abs_stats(np.abs(relative_errors(StepTimeFit.fit(short), long)))}
    return out


def _reach(row: dict) -> float:
    """The longest context the step touches: max context, or a single prefill's end."""
    single_prefill = row["num_seqs"] == 1 and row["num_prefill_tokens"] > 0
    return row["max_context"] + (row["num_prefill_tokens"] if single_prefill else 0.0)


def _abs_stats(err: np.ndarray) -> dict[str, float]:
    if err.size == 0:
        return {}
    return {"median_abs_rel_error": float(np.median(err)), "p90_abs_rel_error": float(np.quantile(err, 0.9)),
            "max_abs_rel_error": float(err.max())}


def format_holdout(report: dict) -> list[str]:
    """Lines for `servesim profile`: cross-validated error overall, by kind, and extrapolations."""
    if "median_abs_rel_error" not in report:
        return [f"too few shapes ({report.get('num_train', 0)}) to report a held-out error"]

    def fmt(d: dict) -> str:
        return (f"median {d['median_abs_rel_error']:.1%}, p90 {d['p90_abs_rel_error']:.1%}, "
                f"max {d['max_abs_rel_error']:.1%}")

    lines = [f"profiled-model held-out error ({report['folds']}-fold, {report['num_test']} shapes): {fmt(report)}"]
    for kind, d in report.get("by_kind", {}).items():
        lines.append(f"  {kind:8s} ({d['count']:3d} shapes): {fmt(d)}")
    if "mixed_from_pure" in report:
        d = report["mixed_from_pure"]
        lines.append(f"  mixed steps from a fit on prefill and decode steps only ({d['count']}): {fmt(d)}")
    if "long_from_short" in report:
        d = report["long_from_short"]
        lines.append(f"  contexts > {d['fit_max_context']} from a fit on shorter ones ({d['count']}): {fmt(d)}")
    return lines


# --- the cost model ------------------------------------------------------------------------


@dataclass
class ProfiledCostModel:
    fit: StepTimeFit
    # Host<->device link for swaps (0 ignores transfers), seconds per copy batch.
    link_bytes_per_s: float = 0.0
    transfer_latency_s: float = 0.0
    table: ProfileTable | None = None

    @classmethod
    def from_table(cls, table: ProfileTable, **link) -> ProfiledCostModel:
        return cls(StepTimeFit.fit(table.rows), table=table, **link)

    def step_time(self, plan: StepPlan) -> float:
        compute = 0.0
        if plan.num_seqs:
            compute = max(self.fit.predict_one(plan_shape(plan)), 0.0)
        return compute + self.transfer_time(plan)

    def repeat_times(self, repeat: Repeat) -> list[float]:
        """Times of a repeat's steps, bit-equal to step_time on each step's plan: the descriptors
        that grow with context worked out in integers per step (a decode's context grows by
        one a step, a prompt chunk's by the chunk), the rest as `plan_shape` gives them, through
        the same sum."""
        plan = repeat.plan
        decodes = [*plan.decodes.context_lens, *(seq.context_len for seq in plan.listed if seq.is_decode)]
        prompts = [(seq.num_new_tokens, seq.context_len) for seq in plan.listed if not seq.is_decode]
        if any(q == 1 for q, _ in prompts):
            # A one-position prompt piece may read as a decode further on: priced plan by plan.
            return [self.step_time(step) for step in repeat.plans()]
        row = plan_shape(plan)
        decode_context, num_decodes = sum(decodes), len(decodes)
        prompt_context = sum(c for _, c in prompts)
        prompt_work, prompt_squares = sum(q * c for q, c in prompts), sum(q * q for q, _ in prompts)
        prompt_tokens = sum(q for q, _ in prompts)
        times = []
        for step in range(repeat.advance, repeat.advance + repeat.num_steps):
            contexts = [c + step * q for q, c in prompts]
            if decodes:
                contexts.append(max(decodes) + step)
            row["sum_context"] = float(decode_context + step * num_decodes + prompt_context + step * prompt_tokens)
            row["max_context"] = float(max(contexts))
            row["sum_decode_context"] = float(decode_context + step * num_decodes)
            row["sum_prefill_context"] = float(prompt_work + step * prompt_squares)
            row["num_prefill_continuations"] = float(sum(1 for c in contexts[:len(prompts)] if c > 0))
            # (No transfers: a repeat's plan moves no blocks.)
            times.append(max(self.fit.predict_one(row), 0.0) + 0.0)
        return times

    def transfer_time(self, plan: StepPlan) -> float:
        moved = len(plan.blocks_to_swap_in) + len(plan.blocks_to_swap_out)
        if moved == 0 or self.link_bytes_per_s <= 0:
            return 0.0
        return self.transfer_latency_s + moved * plan.block_bytes / self.link_bytes_per_s


@dataclass
class ProfiledParams:
    table: str = ""
    # A named host link from simcore.presets (e.g. h200-host-pinned), or explicit numbers.
    link: str | None = None
    link_bytes_per_s: float = 0.0
    transfer_latency_s: float = 0.0
    # Refuse a table measured on a model of a different geometry.
    check_model: bool = True


def make_profiled(params: dict, ctx: CostContext) -> ProfiledCostModel:
    from simcore.validate import build_model_from_params

    source = str(ctx.source) if ctx.source else None
    p = build_model_from_params(ProfiledParams, dict(params or {}), where="cost_model", source=source)
    if not p.table:
        raise ConfigError("the profiled cost model needs a table (a CSV from `servesim profile`)",
                          source=source, where="cost_model.table")
    path = path_beside(p.table, ctx.source)
    table = read_profile(path)
    if p.check_model:
        check_geometry(table, ctx, source)
    link_bytes, latency = p.link_bytes_per_s, p.transfer_latency_s
    if p.link is not None:
        from simcore.presets import get_link

        spec = get_link(p.link, source=source)
        link_bytes, latency = spec.bytes_per_s, spec.latency_s
    return ProfiledCostModel.from_table(table, link_bytes_per_s=link_bytes, transfer_latency_s=latency)


def check_geometry(table: ProfileTable, ctx: CostContext, source: str | None) -> None:
    geometry = table.model_geometry
    if not geometry:
        return
    wrong = [f"{k}: table {geometry[k]}, model {getattr(ctx.model, k)}" for k in GEOMETRY
             if k in geometry and geometry[k] != getattr(ctx.model, k)]
    if wrong:
        raise ConfigError(
            f"profile table {table.path} was measured on model {geometry.get('name')!r}, whose geometry differs "
            f"from {ctx.model.name!r} ({'; '.join(wrong)}); profile this model or set check_model: false",
            source=source, where="cost_model.table",
        )
