"""Fidelity: the real engine against the cheaper cost models, on one workload and one scheduler.

`validate` runs an experiment's workload and policies once with the torch engine inline (each
step executed and timed) and once per cheaper cost model (profiled table, roofline). The same
policy code plans every step, so two comparisons fall out:

- end to end: TTFT/TPOT/ITL/E2EL percentiles and throughput of the real run against each
  simulated one, and per-request pairs. Once step times differ, the two runs schedule
  differently (a step ends earlier, so the next one sees other arrivals): that divergence is
  part of what the end-to-end error measures.
- per step: every plan the real run executed is kept (a recording wrapper around the torch
  cost model, so prediction and measurement are the very same StepPlan) and priced by each
  cheaper model; the relative errors are summarized by step kind (decode-only, prefill-only,
  mixed) and, for the profiled model, on shapes that are not rows of its table.

Outputs under the results folder: measured/ and predicted-<model>/ (ordinary `servesim run`
folders), step_pairs.parquet, request_pairs.parquet, fidelity.json and plots/.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from backends.base import CostContext, step_extras
from backends.profiled import SHAPE_COLUMNS, plan_shape, read_profile, step_kind
from backends.registry import build_cost_model
from experiments.config import CostModelConfig, Experiment, OutputConfig
from experiments.io import path_under
from experiments.progress import RunProgress
from experiments.runner import ExperimentRun, resolve_kv, run_experiment
from experiments.runner import cost_context as runner_cost_context
from simcore.clock import duration_ticks, to_seconds
from simcore.errors import ConfigError, ServesimError
from simcore.paths import expand_home
from simcore.plan import StepPlan

CHEAP_MODELS = ("profiled", "roofline")
LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = {"mean": "mean", "p50": "median", "p90": "p90", "p99": "p99"}
THROUGHPUTS = ("request_throughput", "output_throughput")
STEP_KINDS = ("decode", "prefill", "mixed")


# --- recording the real run's plans -------------------------------------------------------------


def light_plan(plan: StepPlan) -> StepPlan:
    """The plan without block tables and prompt content: all a cheaper cost model reads."""
    seqs = tuple(s._replace(block_table=(), prompt_token_ids=None, segments=None) for s in plan.seqs)
    return plan.with_seqs(seqs)


class RecordingCostModel:
    """Wraps the torch cost model: every step's plan with its measured time, in execution order."""

    needs_block_tables = True

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.plans: list[StepPlan] = []
        self.measured: list[float] = []
        self.gpu_time: list[float] = []
        self.last_step_extras: dict[str, float] = {}

    def step_time(self, plan: StepPlan) -> float:
        seconds = self.inner.step_time(plan)
        self.last_step_extras = step_extras(self.inner)
        self.plans.append(light_plan(plan))
        # The step's time as the clock counts it (to the tick), which is what its record shows
        # (one the clock refuses is the engine's to report).
        self.measured.append(to_seconds(duration_ticks(seconds)) if 0 < seconds < math.inf else seconds)
        self.gpu_time.append(self.last_step_extras.get("gpu_time_s", math.nan))
        return seconds

    def release(self) -> None:
        """Drop the engine (its weights and KV pool) once the run is over."""
        self.inner = None


class Recorders:
    """Wraps each policy's torch cost model in turn, one engine on the device at a time."""

    def __init__(self) -> None:
        self.recorders: list[RecordingCostModel] = []

    def __call__(self, inner: Any) -> RecordingCostModel:
        for previous in self.recorders:
            previous.release()  # free the last policy's weights and KV pool before the next
        _free_device_memory()
        recorder = RecordingCostModel(inner)
        self.recorders.append(recorder)
        return recorder

    def release(self) -> None:
        for recorder in self.recorders:
            recorder.release()
        _free_device_memory()


def _free_device_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- what to compare against ----------------------------------------------------------------------


@dataclass
class ValidationSetup:
    """The real engine's parameters and each cheaper model's, resolved from file and options."""

    torch_params: dict[str, Any]
    against: dict[str, dict[str, Any]]  # model name -> cost_model parameters
    profile_path: Path | None = None
    notes: list[str] = field(default_factory=list)


def resolve_setup(exp: Experiment, *, source: Path | None, device: str | None = None,
                  against: list[str] | None = None, profile: str | Path | None = None,
                  calibration: str | Path | None = None, torch_params: dict[str, Any] | None = None) -> ValidationSetup:
    """The experiment's own cost_model section names a table (profiled), a calibration (roofline)
    or the engine's options (torch); command-line paths (relative to the working directory) win."""
    own = exp.cost_model.name
    params = exp.cost_model.params
    src = str(source) if source else None
    base = Path(source).parent if source is not None else Path.cwd()
    profiled = dict(params) if own == "profiled" else {}
    roofline = dict(params) if own == "roofline" else {}
    engine = dict(params) if own == "torch" else {}
    if own not in ("profiled", "roofline", "torch"):
        raise ConfigError("validate compares the torch engine with profiled and roofline models",
                          source=src, where="cost_model.name", expected="profiled, roofline or torch", found=own)
    if profile is not None:
        profiled["table"] = str(expand_home(profile).resolve())
    if calibration is not None:
        roofline["calibration"] = str(expand_home(calibration).resolve())
    profile_path = None
    if profiled.get("table"):
        profile_path = expand_home(profiled["table"])
        if not profile_path.is_absolute():
            profile_path = base / profile_path
    names = against or (["profiled", "roofline"] if profile_path is not None else ["roofline"])
    for name in names:
        if name not in CHEAP_MODELS:
            raise ConfigError("unknown model to validate against", where="--against",
                              expected=f"a comma-separated subset of {list(CHEAP_MODELS)}", found=name)
    if "profiled" in names and profile_path is None:
        raise ConfigError("the profiled comparison needs a table: pass --profile PATH (a CSV from "
                          "`servesim profile`) or name it in cost_model.table", source=src, where="--against")
    notes: list[str] = []
    engine.update(torch_params or {})
    if device is not None:
        engine["device"] = device
    on_cpu = str(engine.get("device") or ("cuda" if _cuda_available() else "cpu")).startswith("cpu")
    if profile_path is not None and "profiled" in names:
        header = read_profile(profile_path).header
        measured_on = header.get("device", "")
        if measured_on and measured_on.startswith("cpu") != on_cpu:
            notes.append(f"the profile was measured on {measured_on!r}, the engine runs on "
                         f"{'the cpu' if on_cpu else 'cuda'}")
        else:
            # Measure the way the table was measured, unless told otherwise.
            for key in ("dtype", "attention", "cuda_graphs"):
                value = header.get(key)
                if value and key not in engine:
                    engine[key] = (value == "true") if key == "cuda_graphs" else value
            threads = re.search(r"\((\d+) threads\)", measured_on) if on_cpu else None
            if threads:
                engine.setdefault("_threads", int(threads.group(1)))
    if engine.get("cuda_graphs") and str(engine.get("device", "cuda")).startswith("cpu"):
        engine["cuda_graphs"] = False
    against_params = {name: dict(profiled if name == "profiled" else roofline) for name in names}
    return ValidationSetup(torch_params=engine, against=against_params, profile_path=profile_path, notes=notes)


def _cuda_available() -> bool:
    try:
        import torch
    except ModuleNotFoundError:
        return False
    return torch.cuda.is_available()


# --- the runs -------------------------------------------------------------------------------------


@dataclass
class ValidationResult:
    report: dict
    step_pairs: pd.DataFrame
    request_pairs: pd.DataFrame
    measured: ExperimentRun
    predicted: dict[str, ExperimentRun]
    files: dict[str, str]


def _with_cost_model(exp: Experiment, name: str, params: dict) -> Experiment:
    return exp.model_copy(update={
        "cost_model": CostModelConfig(name=name, **params),
        "output": OutputConfig(format="parquet", plots=False),
        "sweep": None, "variants": None,
    })


def cost_context(exp: Experiment, source: Path | None) -> CostContext:
    """The context run_experiment gives its cost models (so per-step predictions use the same)."""
    return runner_cost_context(exp, resolve_kv(exp, source=str(source) if source else None), source)


def run_validation(exp: Experiment, setup: ValidationSetup, *, source: Path | None, out_dir: Path,
                   echo: Callable[[str], None] | None = None, progress: RunProgress | None = None) -> ValidationResult:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    say = echo or (lambda line: None)
    ctx = cost_context(exp, source)
    # Build the cheaper models first: a bad table or calibration fails before the slow real run.
    cheap = {name: build_cost_model(name, params, ctx) for name, params in setup.against.items()}
    torch_params = {k: v for k, v in setup.torch_params.items() if not k.startswith("_")}
    threads = setup.torch_params.get("_threads")
    say(f"validate {exp.name}: real engine ({_describe(torch_params)}) vs {', '.join(cheap)}")
    recorders = Recorders()
    real_exp = _with_cost_model(exp, "torch", torch_params)
    try:
        with _torch_threads(threads):
            measured = run_experiment(real_exp, source=source, out_dir=path_under(out_dir, "measured"), echo=echo,
                                      wrap_cost_model=recorders, progress=progress)
        plans = {r.label: (rec.plans, rec.measured, rec.gpu_time)
                 for r, rec in zip(measured.runs, recorders.recorders, strict=True)}
    finally:
        recorders.release()
    predicted: dict[str, ExperimentRun] = {}
    for name, params in setup.against.items():
        say(f"  simulating with {name}")
        predicted[name] = run_experiment(_with_cost_model(exp, name, params), source=source,
                                         out_dir=path_under(out_dir, f"predicted-{name}"), echo=echo,
                                         progress=progress)
    profile_shapes = _profile_shapes(setup.profile_path) if "profiled" in cheap else set()
    step_frames, request_frames = [], []
    for run in measured.runs:
        step_log = _step_log(run, path_under(out_dir, "measured", run.label))
        recorded, seconds, gpu = plans[run.label]
        _check_pairing(run.label, recorded, seconds, step_log)
        for name, model in cheap.items():
            step_frames.append(step_pairs(run.label, name, model, recorded, seconds, gpu,
                                          profile_shapes if name == "profiled" else None))
            other = next(r for r in predicted[name].runs if r.label == run.label)
            request_frames.append(request_pairs(run.label, name, run.requests, other.requests))
    steps = pd.concat(step_frames, ignore_index=True) if step_frames else pd.DataFrame()
    requests = pd.concat(request_frames, ignore_index=True) if request_frames else pd.DataFrame()
    report = build_report(exp, setup, measured, predicted, steps, requests)
    files = {"step_pairs": "step_pairs.parquet", "request_pairs": "request_pairs.parquet", "report": "fidelity.json"}
    steps.to_parquet(path_under(out_dir, files["step_pairs"]), index=False)
    requests.to_parquet(path_under(out_dir, files["request_pairs"]), index=False)
    from experiments.fidelity_plots import plot_fidelity

    files.update(plot_fidelity(path_under(out_dir, "plots"), steps, measured, predicted))
    report["files"] = files
    path_under(out_dir, files["report"]).write_text(json.dumps(_json_safe(report), indent=2))
    return ValidationResult(report, steps, requests, measured, predicted, files)


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    if not threads:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _describe(params: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in params.items()) or "defaults"


def _step_log(run: Any, folder: Path) -> dict:
    """The run's step columns: from steps.parquet when the log was streamed there (and moved)."""
    if run.result.steps.spilled and (folder / "steps.parquet").exists():
        import pyarrow.parquet as pq

        table = pq.read_table(folder / "steps.parquet", columns=["step_id", "duration_s"])
        return {name: table.column(name).to_numpy() for name in table.column_names}
    return run.result.steps.as_dict()


def _check_pairing(label: str, plans: list[StepPlan], seconds: list[float], log: dict) -> None:
    """Every logged step is a recorded plan, in order, with the very duration the clock advanced by."""
    ok = len(plans) == len(log["step_id"]) and all(
        p.step_id == s and t == d for p, s, t, d in zip(plans, log["step_id"].tolist(), seconds,
                                                         log["duration_s"].tolist(), strict=True))
    if not ok:
        raise ServesimError(f"{label}: the recorded plans do not match the real run's step log "
                            f"({len(plans)} plans, {len(log['step_id'])} steps); per-step pairs would be wrong")


def _profile_shapes(path: Path | None) -> set[tuple]:
    if path is None:
        return set()
    return {tuple(row[c] for c in SHAPE_COLUMNS) for row in read_profile(path).rows}


# --- pairs --------------------------------------------------------------------------------------------


def step_pairs(label: str, name: str, model: Any, plans: list[StepPlan], measured: list[float],
               gpu_time: list[float], profile_shapes: set[tuple] | None) -> pd.DataFrame:
    rows = []
    for plan, seconds, gpu in zip(plans, measured, gpu_time, strict=True):
        shape = plan_shape(plan)
        predicted = float(model.step_time(plan))
        rows.append({
            "policy": label, "against": name, "step_id": plan.step_id,
            "kind": step_kind(shape) if plan.seqs else "transfer",
            "num_seqs": int(shape["num_seqs"]), "num_prefill_tokens": int(shape["num_prefill_tokens"]),
            "num_decode_tokens": int(shape["num_decode_tokens"]),
            "num_prefill_pieces": int(shape["num_seqs"] - shape["num_decode_tokens"]),
            "sum_context": int(shape["sum_context"]), "max_context": int(shape["max_context"]),
            "num_selecting": int(shape["num_selecting"]),
            "num_swapped_blocks": len(plan.blocks_to_swap_in) + len(plan.blocks_to_swap_out),
            "measured_s": seconds, "gpu_time_s": gpu, "predicted_s": predicted,
            "rel_error": (predicted - seconds) / seconds,
            "in_profile": (tuple(shape[c] for c in SHAPE_COLUMNS) in profile_shapes) if profile_shapes is not None else False,
        })
    return pd.DataFrame(rows)


PAIRED = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2el_s"}


def request_pairs(label: str, name: str, measured: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    keep = ["request_id", "status", *PAIRED.values()]
    m = measured[["request_id", "prompt_len", "num_outputs", "status", *PAIRED.values()]]
    both = m.merge(predicted[keep], on="request_id", how="outer", suffixes=("_measured", "_predicted"))
    out = pd.DataFrame({"policy": label, "against": name, "request_id": both["request_id"],
                        "prompt_len": both["prompt_len"], "num_outputs": both["num_outputs"],
                        "status_measured": both["status_measured"], "status_predicted": both["status_predicted"]})
    for metric, column in PAIRED.items():
        mv, pv = both[f"{column}_measured"].astype(float), both[f"{column}_predicted"].astype(float)
        out[f"{metric}_measured_s"] = mv
        out[f"{metric}_predicted_s"] = pv
        out[f"{metric}_rel_error"] = (pv - mv) / mv
    return out


# --- the report -----------------------------------------------------------------------------------------


def _rel(measured: Any, predicted: Any) -> dict:
    ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (measured, predicted)) and measured != 0
    return {"measured": measured, "predicted": predicted,
            "rel_error": (predicted - measured) / measured if ok else None}


def end_to_end(measured: dict, predicted: dict) -> dict:
    out: dict = {}
    for metric in LATENCIES:
        out[metric] = {stat: _rel(measured.get(f"{key}_{metric}_ms"), predicted.get(f"{key}_{metric}_ms"))
                       for stat, key in STATS.items()}
    for key in THROUGHPUTS:
        out[key] = _rel(measured.get(key), predicted.get(key))
    out["completed"] = {"measured": measured.get("completed"), "predicted": predicted.get("completed")}
    return out


def step_error_stats(frame: pd.DataFrame) -> dict:
    """median / p90 / max |relative error| of steps, overall, by kind, and off the profile's grid.

    Each group also says how much of the run's measured time its steps carry (`time_share`) and the
    relative error of their summed time (`time_rel_error`): a median over steps is the many short
    decode steps', while end-to-end latencies follow the time, which few long prompt steps may hold
    (the first H200 run: 4-18% of the steps, 30-62% of the time)."""
    run_time = float(frame["measured_s"].sum())

    def stats(part: pd.DataFrame) -> dict:
        err = part["rel_error"].abs().to_numpy(dtype=float)
        if err.size == 0:
            return {"count": 0}
        measured, predicted = float(part["measured_s"].sum()), float(part["predicted_s"].sum())
        return {"count": int(err.size), "median_abs_rel_error": float(np.median(err)),
                "p90_abs_rel_error": float(np.quantile(err, 0.9)), "max_abs_rel_error": float(err.max()),
                "mean_rel_error": float(part["rel_error"].mean()),
                "time_share": measured / run_time if run_time > 0 else None,
                "time_rel_error": (predicted - measured) / measured if measured > 0 else None}

    out = {"all": stats(frame)}
    for kind in STEP_KINDS:
        out[kind] = stats(frame[frame["kind"] == kind])
    out["prompt"] = stats(frame[frame["kind"].isin(("prefill", "mixed"))])
    out["not_in_profile"] = stats(frame[~frame["in_profile"].astype(bool)])
    measured, predicted = frame["measured_s"].sum(), frame["predicted_s"].sum()
    out["total_time"] = _rel(float(measured), float(predicted))
    return out


def request_error_stats(frame: pd.DataFrame) -> dict:
    out = {}
    for metric in PAIRED:
        err = frame[f"{metric}_rel_error"].abs().to_numpy(dtype=float)
        err = err[np.isfinite(err)]
        out[metric] = ({"count": int(err.size), "median_abs_rel_error": float(np.median(err)),
                        "p90_abs_rel_error": float(np.quantile(err, 0.9))} if err.size else {"count": 0})
    return out


def build_report(exp: Experiment, setup: ValidationSetup, measured: ExperimentRun, predicted: dict[str, ExperimentRun],
                 steps: pd.DataFrame, requests: pd.DataFrame) -> dict:
    import torch

    device = setup.torch_params.get("device")
    report: dict = {
        "experiment": exp.name, "model": exp.model, "hardware": exp.hardware,
        "engine": {**{k: v for k, v in setup.torch_params.items() if not k.startswith("_")},
                   "threads": setup.torch_params.get("_threads") or torch.get_num_threads(), "torch": torch.__version__,
                   "device_name": _device_name(device)},
        "against": {name: _plain_params(p) for name, p in setup.against.items()},
        "notes": list(setup.notes),
        "policies": {},
    }
    for run in measured.runs:
        entry: dict = {"num_steps": len(run.result.steps), "completed": run.summary.get("completed"),
                       "sim_time_s": run.result.sim_time_s, "against": {}}
        for name, other_run in predicted.items():
            other = next(r for r in other_run.runs if r.label == run.label)
            mask_s = (steps["policy"] == run.label) & (steps["against"] == name)
            mask_r = (requests["policy"] == run.label) & (requests["against"] == name)
            entry["against"][name] = {
                "end_to_end": end_to_end(run.summary, other.summary),
                "steps": step_error_stats(steps[mask_s]),
                "requests": request_error_stats(requests[mask_r]),
            }
        report["policies"][run.label] = entry
    return report


def _device_name(device: str | None) -> str:
    import torch

    if device and str(device).startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    if (device is None or str(device).startswith("cuda")) and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    import platform

    return f"cpu {platform.machine()}"


def _plain_params(params: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in params.items()}


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


# --- the printed tables --------------------------------------------------------------------------------


def _pct(value: Any) -> str:
    return f"{value:+.1%}" if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def _abs_pct(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def format_report(report: dict) -> str:
    """Two tables: end-to-end relative errors (predicted vs measured) and per-step |errors| by kind."""
    e2e_cols = [("TTFT", "ttft", "mean"), ("TTFT", "ttft", "p50"), ("TTFT", "ttft", "p90"), ("TTFT", "ttft", "p99"),
                ("TPOT", "tpot", "mean"), ("TPOT", "tpot", "p50"), ("TPOT", "tpot", "p90"), ("TPOT", "tpot", "p99"),
                ("ITL", "itl", "p50"), ("ITL", "itl", "p90"), ("E2EL", "e2el", "p50"), ("E2EL", "e2el", "p90")]
    head = ["policy", "vs", *(f"{a} {s}" for a, _, s in e2e_cols), "req/s"]
    rows = []
    step_rows = []
    for label, entry in report["policies"].items():
        for name, comp in entry["against"].items():
            e2e = comp["end_to_end"]
            rows.append([label, name, *(_pct(e2e[m][s]["rel_error"]) for _, m, s in e2e_cols),
                         _pct(e2e["request_throughput"]["rel_error"])])
            st = comp["steps"]
            cells = []
            for kind in ("all", *STEP_KINDS, "not_in_profile"):
                d = st.get(kind, {})
                cells.append(f"{_abs_pct(d.get('median_abs_rel_error'))} / {_abs_pct(d.get('p90_abs_rel_error'))}"
                             f" ({d.get('count', 0)})" if d.get("count") else "-")
            prompt = st.get("prompt", {})
            prompt_time = (f"{_abs_pct(prompt.get('time_share'))} ({_pct(prompt.get('time_rel_error'))})"
                           if prompt.get("count") else "-")
            step_rows.append([label, name, *cells, prompt_time, _pct(st["total_time"]["rel_error"])])
    lines = ["end to end: (predicted - measured) / measured"]
    lines += _table(head, rows)
    lines += ["", "per step: |relative error| median / p90 (steps), on the real run's plans; prompt time: the "
              "share of the measured time in prefill and mixed steps (the error of their sum)"]
    lines += _table(["policy", "vs", "all", "decode", "prefill", "mixed", "not in profile", "prompt time", "total time"],
                    step_rows)
    for note in report.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]
    fmt = lambda cells: "  ".join(str(c).rjust(w) if i > 1 else str(c).ljust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    return [fmt(head), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]
