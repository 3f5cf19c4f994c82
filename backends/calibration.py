"""Calibrating the roofline on a measured profile: fit mfu, mbu and the overheads, keep the formula.

The roofline prices a step as max(dense FLOPs / (peak x mfu), dense bytes / (bandwidth x mbu))
+ the same for attention + communication + step_overhead_s + per_seq_overhead_s x seqs
(backends/roofline.py). For fixed (mfu, mbu) the time is linear in the two overheads, so the
fit is a search over (mfu, mbu) on a log grid, then coordinate refinement, with the overheads
solved exactly at every point by non-negative least squares on relative error. Loss: the sum of
squared relative errors over the profile's rows (every shape weighs the same, short or long).

A profile row carries aggregates, not per-request lists, but they are exactly what the roofline
needs: sum q (2c + q) = 2 sum_prefill_context + 2 sum_prefill_causal - prefill tokens
+ 2 sum_decode_context + decode tokens, and positions touched = sum_context + tokens.

The calibration file (YAML) names the hardware it was measured on and the fitted parameters:

    kind: roofline-calibration
    model: llama-3.1-8b
    hardware: h200
    params: {mfu: 0.52, mbu: 0.71, step_overhead_s: 0.0021, per_seq_overhead_s: 1.1e-05}

An experiment uses it as `cost_model: {name: roofline, calibration: calib.yaml}` (a path relative
to the experiment file); parameters given beside `calibration` override the file's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from backends.profiled import nnls, step_kind
from backends.roofline import RooflineCostModel, tunable_names
from simcore.errors import ConfigError
from simcore.paths import path_beside
from simcore.validate import load_yaml_text

CALIBRATION_KIND = "roofline-calibration"
# Parameters `servesim calibrate` can fit; the first two scale the roofline, the rest are linear.
FITTABLE = ("mfu", "mbu", "step_overhead_s", "per_seq_overhead_s")
DEFAULT_FIT = FITTABLE
FILE_KEYS = ("kind", "model", "hardware", "profile", "profile_device", "fitted", "params", "error_before",
             "error_after", "note")
KINDS = ("decode", "prefill", "mixed")
# A fit whose median |relative error| (overall or for one step kind) is still above this after
# calibrating is reported as poor: the roofline's formula, not its parameters, misses those steps.
# 15% is the accuracy docs/fidelity.md expects of a calibrated roofline on a GPU profile.
POOR_FIT_MEDIAN_ERROR = 0.15


# --- the roofline over profile rows, vectorized -----------------------------------------------


@dataclass
class ShapeTerms:
    """Per-row roofline quantities that do not depend on mfu, mbu or the overheads."""

    kind: np.ndarray
    time_s: np.ndarray
    num_seqs: np.ndarray
    dense_compute: np.ndarray  # seconds at mfu = 1
    dense_memory: np.ndarray  # seconds at mbu = 1
    attn_compute: np.ndarray
    attn_memory: np.ndarray
    comm: np.ndarray
    # The layers' kernel floors, which a step pays whatever mfu and mbu are (seconds).
    kernel_floors: float = 0.0

    def predict(self, mfu: float, mbu: float, step_overhead_s: float, per_seq_overhead_s: float) -> np.ndarray:
        return self.core(mfu, mbu) + step_overhead_s + per_seq_overhead_s * self.num_seqs

    def core(self, mfu: float, mbu: float) -> np.ndarray:
        # The roofline's own order of additions: dense + attention + comm (+ overhead).
        dense = np.maximum(self.dense_compute / mfu, self.dense_memory / mbu) + self.kernel_floors
        attention = np.maximum(self.attn_compute / mfu, self.attn_memory / mbu)
        return dense + attention + self.comm


def row_quantities(rows: list[dict]) -> dict[str, np.ndarray]:
    """Tokens, seqs, selecting rows, attention work sum q(2c+q) and KV positions touched, per row."""
    col = {k: np.asarray([float(r[k]) for r in rows]) for k in (
        "num_seqs", "num_prefill_tokens", "num_decode_tokens", "sum_context", "sum_prefill_context",
        "sum_prefill_causal", "sum_decode_context", "num_selecting")}
    tokens = col["num_prefill_tokens"] + col["num_decode_tokens"]
    attn_work = (2 * col["sum_prefill_context"] + 2 * col["sum_prefill_causal"] - col["num_prefill_tokens"]
                 + 2 * col["sum_decode_context"] + col["num_decode_tokens"])
    return {"num_tokens": tokens, "num_seqs": col["num_seqs"], "num_selecting": col["num_selecting"],
            "num_prefill_tokens": col["num_prefill_tokens"], "attn_work": attn_work,
            "kv_positions": col["sum_context"] + tokens}


def shape_terms(model: RooflineCostModel, rows: list[dict]) -> ShapeTerms:
    """The roofline's parts for each row at mfu = mbu = 1 (its constants, step_time's arithmetic)."""
    q = row_quantities(rows)
    m = model
    peak, bandwidth = m.hardware.peak_flops, m.hardware.mem_bandwidth
    # GEMMs at their activation dtype's peak (fp8 W8A8 at the fp8 one) as the roofline derates
    # it (peak_efficiency), attention at bf16's. (Profiles come from the torch engine, which runs
    # dense models only: the routed experts' kernels have no terms here.)
    gemm_peak = m.gemm_peak()
    # The rows the GEMMs run and those that select (a CUDA graph's padded batch where one replays
    # the step), as the roofline prices them.
    rows_run, num_selecting = np.asarray(
        [m.gemm_rows(int(tokens), int(seqs), int(prefill), int(selecting)) for tokens, seqs, prefill, selecting
         in zip(q["num_tokens"], q["num_seqs"], q["num_prefill_tokens"], q["num_selecting"])], dtype=float,
    ).reshape(-1, 2).T
    units = m.step_units()
    weight_bytes = np.where(num_selecting > 0, units.weight_bytes_with_head, units.weight_bytes_no_head)
    dense_flops = rows_run * units.gemm_flops_per_token + num_selecting * units.lm_head_flops_per_select
    dense_bytes = weight_bytes + rows_run * units.act_bytes_per_token
    return ShapeTerms(
        kind=np.asarray([r.get("kind") or step_kind(r) for r in rows]),
        time_s=np.asarray([float(r["time_s"]) for r in rows]),
        num_seqs=q["num_seqs"],
        dense_compute=dense_flops / gemm_peak,
        dense_memory=dense_bytes / bandwidth,
        attn_compute=q["attn_work"] * units.attn_flops_per_work / peak,
        attn_memory=q["kv_positions"] * units.kv_bytes_per_pos / bandwidth,
        comm=rows_run * units.comm_per_token + units.comm_fixed,
        kernel_floors=units.kernel_floors,
    )


# --- error summaries ---------------------------------------------------------------------------


def error_summary(predicted: np.ndarray, measured: np.ndarray, kinds: np.ndarray | None = None) -> dict:
    """median / p90 / max |relative error|, overall and by step kind."""

    def stats(p: np.ndarray, m: np.ndarray) -> dict:
        if m.size == 0:
            return {"count": 0}
        err = np.abs(p - m) / m
        return {"count": int(m.size), "median_abs_rel_error": float(np.median(err)),
                "p90_abs_rel_error": float(np.quantile(err, 0.9)), "max_abs_rel_error": float(err.max())}

    out = {"all": stats(predicted, measured)}
    if kinds is not None:
        for kind in KINDS:
            mask = kinds == kind
            if mask.any():
                out[kind] = stats(predicted[mask], measured[mask])
    return out


# --- the fit -------------------------------------------------------------------------------------


@dataclass
class CalibrationResult:
    params: dict[str, float]
    before: dict
    after: dict
    fitted: tuple[str, ...]
    loss: float
    base_params: dict[str, float] = field(default_factory=dict)


def _loss_and_overheads(terms: ShapeTerms, mfu: float, mbu: float, fixed: dict[str, float],
                        fit_step: bool, fit_seq: bool) -> tuple[float, float, float]:
    """Best non-negative overheads for this (mfu, mbu) and the resulting sum of squared rel. errors."""
    y = terms.time_s
    core = terms.core(mfu, mbu)
    step = fixed["step_overhead_s"]
    seq = fixed["per_seq_overhead_s"]
    columns = []
    if fit_step:
        columns.append(np.ones_like(y))
    if fit_seq:
        columns.append(terms.num_seqs)
    base = core + (0.0 if fit_step else step) + (0.0 if fit_seq else seq * terms.num_seqs)
    if columns:
        a = np.stack(columns, axis=1) / y[:, None]
        b = (y - base) / y
        scale = np.abs(a).max(axis=0)
        scale[scale == 0] = 1.0
        x = nnls(a / scale, b) / scale
        values = iter(x.tolist())
        if fit_step:
            step = next(values)
        if fit_seq:
            seq = next(values)
    resid = (base + (step if fit_step else 0.0) + (seq * terms.num_seqs if fit_seq else 0.0) - y) / y
    return float(np.dot(resid, resid)), step, seq


def fit_roofline(model: RooflineCostModel, rows: list[dict], *, fit: tuple[str, ...] = DEFAULT_FIT,
                 grid_points: int = 25, refine_iters: int = 60) -> CalibrationResult:
    """Fit `fit` (a subset of FITTABLE) of `model`'s parameters to measured rows; the rest stay."""
    unknown = [p for p in fit if p not in FITTABLE]
    if unknown or not fit:
        raise ValueError(f"can fit {list(FITTABLE)}, not {unknown or 'nothing'}")
    if not rows:
        raise ValueError("no profile rows to fit")
    base = {p: float(getattr(model, p)) for p in FITTABLE}
    terms = shape_terms(model, rows)
    fit_step, fit_seq = "step_overhead_s" in fit, "per_seq_overhead_s" in fit

    def evaluate(mfu: float, mbu: float) -> tuple[float, float, float]:
        return _loss_and_overheads(terms, mfu, mbu, base, fit_step, fit_seq)

    mfus = np.logspace(-3, 0, grid_points) if "mfu" in fit else np.asarray([base["mfu"]])
    mbus = np.logspace(-3, 0, grid_points) if "mbu" in fit else np.asarray([base["mbu"]])
    best = (math.inf, base["mfu"], base["mbu"])
    for mfu in mfus.tolist():
        for mbu in mbus.tolist():
            loss = evaluate(mfu, mbu)[0]
            if loss < best[0]:
                best = (loss, mfu, mbu)
    # Coordinate search in log space around the best grid point, halving the step when stuck.
    loss, mfu, mbu = best
    step = math.log(10.0) * 3 / max(grid_points - 1, 1)
    free = [i for i, p in enumerate(("mfu", "mbu")) if p in fit]
    for _ in range(refine_iters):
        improved = False
        for i in free:
            for direction in (1.0, -1.0):
                trial = [mfu, mbu]
                trial[i] = min(1.0, trial[i] * math.exp(direction * step))
                trial_loss = evaluate(*trial)[0]
                if trial_loss < loss - 1e-15:
                    loss, (mfu, mbu), improved = trial_loss, trial, True
        if not improved:
            step /= 2
            if step < 1e-4:
                break
    loss, step_overhead, seq_overhead = evaluate(mfu, mbu)
    params = {"mfu": mfu, "mbu": mbu, "step_overhead_s": step_overhead, "per_seq_overhead_s": seq_overhead}
    params = {k: (_round(v) if k in fit else base[k]) for k, v in params.items()}
    before = error_summary(terms.predict(**base), terms.time_s, terms.kind)
    after = error_summary(terms.predict(**params), terms.time_s, terms.kind)
    return CalibrationResult(params=params, before=before, after=after, fitted=tuple(fit), loss=loss,
                             base_params=base)


def _round(value: float) -> float:
    """Six significant digits: readable in the YAML, far below measurement noise."""
    return float(f"{value:.6g}")


def poor_fit_warnings(after: dict) -> list[str]:
    """One line per step group (all, decode, prefill, mixed) whose median |relative error| after
    the fit is above POOR_FIT_MEDIAN_ERROR; empty when the fit is good."""
    warnings = []
    for kind, stats in after.items():
        median = stats.get("median_abs_rel_error")
        if stats.get("count") and median is not None and median > POOR_FIT_MEDIAN_ERROR:
            steps = "all steps" if kind == "all" else f"{kind} steps"
            warnings.append(f"poor fit on {steps}: median |relative error| {median:.0%} after calibrating "
                            f"(above {POOR_FIT_MEDIAN_ERROR:.0%})")
    return warnings


# --- the file ------------------------------------------------------------------------------------


def write_calibration(path: str | Path, result: CalibrationResult, *, model: str, hardware: str,
                      profile: str | None = None, profile_device: str | None = None) -> None:
    doc: dict[str, Any] = {"kind": CALIBRATION_KIND, "model": model, "hardware": hardware}
    if profile is not None:
        doc["profile"] = profile
    if profile_device is not None:
        doc["profile_device"] = profile_device
    doc["fitted"] = list(result.fitted)
    doc["params"] = dict(result.params)
    doc["error_before"] = _plain(result.before)
    doc["error_after"] = _plain(result.after)
    warnings = poor_fit_warnings(result.after)
    if warnings:
        doc["note"] = "; ".join(warnings)
    text = ("# Roofline calibration written by `servesim calibrate`; use it as\n"
            "#   cost_model: {name: roofline, calibration: <this file>}\n")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + yaml.safe_dump(doc, sort_keys=False))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, float):
        return _round(value)
    return value


def resolve_calibration_path(raw: Any, source: Path | str | None, where: str) -> Path:
    if not isinstance(raw, (str, Path)) or not str(raw):
        raise ConfigError("calibration must be a path to a file written by `servesim calibrate`",
                          source=str(source) if source else None, where=where, found=repr(raw))
    return path_beside(raw, source)


def load_calibration(path: str | Path, *, hardware: str | None = None, source: str | None = None,
                     where: str = "cost_model.calibration") -> dict[str, float]:
    """The roofline parameters in a calibration file; any defect is a ConfigError naming the file."""
    path = Path(path)
    named = f"calibration file {path}"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {named} ({exc.strerror})", source=source, where=where) from None
    try:
        doc = load_yaml_text(text)  # within the limits of an experiment file (no alias bombs)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{named} is not valid YAML{at}", source=source, where=where) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{named} must be a mapping", source=source, where=where,
                          expected=f"kind: {CALIBRATION_KIND} and params", found=type(doc).__name__)
    if doc.get("kind") != CALIBRATION_KIND:
        raise ConfigError(f"{named} is not a roofline calibration", source=source, where=where,
                          expected=f"kind: {CALIBRATION_KIND}", found=str(doc.get("kind")))
    unknown = [k for k in doc if k not in FILE_KEYS]
    if unknown:
        raise ConfigError(f"{named} has an unknown key", source=source, where=where,
                          expected=f"keys among {list(FILE_KEYS)}", found=str(unknown[0]))
    params = doc.get("params")
    if not isinstance(params, dict) or not params:
        raise ConfigError(f"{named} lacks its params mapping", source=source, where=where,
                          expected="params: {mfu: ..., mbu: ..., step_overhead_s: ...}")
    names = [n for n in tunable_names() if n != "calibration"]
    for key, value in params.items():
        if key not in names:
            raise ConfigError(f"{named}: unknown roofline parameter", source=source, where=f"{where}: params.{key}",
                              expected=f"one of {names}", found=str(key), choices=names)
        if key in FITTABLE and (isinstance(value, bool) or not isinstance(value, (int, float))
                                or not math.isfinite(value)):
            raise ConfigError(f"{named}: params.{key} is not a finite number", source=source, where=where,
                              found=repr(value))
    made_for = doc.get("hardware")
    if hardware is not None and made_for is not None and str(made_for) != hardware:
        raise ConfigError(
            f"{named} was fitted on hardware {made_for!r}, but the experiment runs on {hardware!r}; "
            f"calibrate on a profile measured there", source=source, where=where)
    return dict(params)
