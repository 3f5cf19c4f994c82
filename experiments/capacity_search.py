"""Saturation search: the highest request rate at which each policy (and variant) meets the SLOs.

For every (variant, policy) series the search bisects `workload.arrivals.rate` between --low and
--high until the bracket is narrower than --tol. A probe passes when every request finished and
every SLO metric (e.g. p90_ttft_ms) is at or under its limit. All series advance in lockstep, so
each round's probes run in parallel through the sweep executors; every probe is stored like a
sweep point (DIR/points/<id>/DONE.json), so an interrupted search resumes where it stopped.

What the search varies (`choose_param`): a synthetic or session workload's `arrivals.rate`, or
for a timed trace `trace.target_rate`, the trace's mean arrival rate in req/s (its gaps are
rescaled, keeping their pattern; see workloads/traces/options.py). Either way the rates are
requests (or sessions) per second, so --low/--high/--tol mean the same for both. Sessions start
at `arrivals.rate` (each one's later turns then follow its earlier ones). With closed-loop
clients (`clients:`) it varies `clients.concurrency`, a whole number of clients: the bracket's
ends and probes are whole numbers, and the search stops when they are --tol (at least 1) apart.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.config import parse_experiment, policy_labels, set_dotted
from experiments.io import path_under, scratch_dir, write_json
from experiments.sweep import SweepPoint, expand
from experiments.sweep_exec import Executor, PointTask, make_executor
from experiments.sweep_store import SweepStore
from simcore.errors import ConfigError, ServesimError

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "p50", "p90", "p95", "p99")
RATE_PATH = "workload.arrivals.rate"
# With closed-loop clients: how many.
CONCURRENCY_PATH = "clients.concurrency"
# For a timed trace: the mean arrival rate (req/s) its gaps are rescaled to.
TRACE_RATE_PATH = "workload.trace.target_rate"
# Probe rates are rounded to this many decimals (so that probe ids and tables stay readable).
RATE_DECIMALS = 6
# Rounds after which a search stops in any case (a safety net: with --tol at least 4 float
# spacings at --high, see check_tol, a search takes at most 52 rounds; 11 with the defaults).
MAX_ROUNDS = 64
# The search's result, written last: a capacity folder is complete once it has one.
RESULT_FILE = "capacity.json"


def parse_slo(text: str) -> dict[str, float]:
    """'ttft_p90_ms=500,tpot_p90_ms=50' -> {'p90_ttft_ms': 500.0, 'p90_tpot_ms': 50.0} (summary names).

    Either order works (ttft_p90_ms or p90_ttft_ms), so the flag reads like the summary keys or
    like speech."""
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, raw = item.partition("=")
        match = re.fullmatch(r"(?:(\w+?)_(\w+?))_ms", name.strip())
        pair = (match.group(1), match.group(2)) if match else ("", "")
        stat, metric = pair if pair[0] in STATS else pair[::-1]
        if stat not in STATS or metric not in METRICS:
            choices = [f"{m}_{s}_ms" for m in METRICS for s in STATS]
            raise ConfigError("unknown SLO metric", where="--slo", expected="e.g. ttft_p90_ms or p99_tpot_ms",
                              found=name.strip(), choices=choices)
        try:
            limit = float(raw)
        except ValueError:
            raise ConfigError("an SLO limit must be a number of milliseconds", where=f"--slo {name}",
                              found=raw) from None
        if not 0 < limit < math.inf:  # float() reads 'nan' and 'inf' too; NaN fails every comparison
            raise ConfigError("an SLO limit must be a finite, positive number of milliseconds", where=f"--slo {name}",
                              found=raw)
        out[f"{stat}_{metric}_ms"] = limit
    if not out:
        raise ConfigError("give at least one SLO, e.g. --slo ttft_p90_ms=500,tpot_p90_ms=50", where="--slo")
    return out


@dataclass
class Probe:
    rate: float
    passed: bool
    summary: dict[str, Any]
    error: str | None = None


@dataclass
class Series:
    """One (variant, policy) search: its experiment mapping with one policy, and its probes so far."""

    index: int
    variant: str | None
    label: str
    data: dict[str, Any]
    low: float | None = None  # highest rate known to pass
    high: float | None = None  # lowest rate known to fail
    status: str = "searching"  # then: ok, at-high, below-low, error
    probes: list[Probe] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.label if self.variant is None else f"{self.label} / {self.variant}"

    def probe_at(self, rate: float) -> Probe | None:
        return next((p for p in self.probes if p.rate == rate), None)


@dataclass
class CapacityResult:
    name: str
    slo: dict[str, float]
    param: str
    bounds: tuple[float, float, float]
    series: list[Series]

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "slo": self.slo, "param": self.param,
            "low": self.bounds[0], "high": self.bounds[1], "tol": self.bounds[2],
            "series": [{
                "variant": s.variant, "label": s.label, "status": s.status, "max_rate": s.low,
                "first_failing_rate": s.high,
                "probes": [{"rate": p.rate, "passed": p.passed, "error": p.error,
                            **{k: p.summary.get(k) for k in ("completed", "num_requests", *self.slo)}}
                           for p in sorted(s.probes, key=lambda p: p.rate)],
            } for s in self.series],
        }


def choose_param(data: dict[str, Any], *, source: str | None) -> str:
    """What the search varies when --param is not given: closed-loop clients' concurrency;
    else `arrivals.rate` where the workload draws arrivals (synthetic, sessions, ShareGPT, a
    trace with lengths_only), else a timed trace's `target_rate`."""
    clients = data.get("clients")
    if isinstance(clients, dict) and clients.get("concurrency") is not None:  # (timeouts alone: open loop)
        return CONCURRENCY_PATH
    workload = data.get("workload")
    workload = workload if isinstance(workload, dict) else {}
    arrivals = workload.get("arrivals")
    trace = workload.get("trace")
    if isinstance(arrivals, dict) and "rate" in arrivals:
        return RATE_PATH
    if isinstance(trace, dict) and not trace.get("lengths_only") and trace.get("format") != "sharegpt":
        return TRACE_RATE_PATH
    raise ConfigError("the capacity search varies a request rate, which this workload does not have",
                      source=source, where="workload",
                      expected="`arrivals:` with a rate, or a timed `trace:` (or pass --param)")


def _prepare_trace_rate(data: dict[str, Any], param: str, source: str | None) -> list[str]:
    """Searching a trace's target_rate: drop a time_scale (the two options conflict, and the
    search sets the rate itself) and give target_rate a placeholder, so the path exists."""
    if param != TRACE_RATE_PATH:
        return []
    trace = (data.get("workload") or {}).get("trace")
    if not isinstance(trace, dict):
        raise ConfigError(f"the capacity search varies {param}, but this experiment has no trace", source=source,
                          where="workload.trace", expected="a timed trace (or another --param)")
    notes = []
    if trace.pop("time_scale", None) is not None:
        notes.append("the trace's time_scale is replaced by the searched target_rate")
    trace.setdefault("target_rate", 1.0)
    return notes


def trace_rate(data: dict[str, Any], *, source: str | None) -> float | None:
    """The mean arrival rate (req/s) of the trace in `data` (one series' experiment) without the
    searched target_rate: the file's own pace, a reference for the searched rates. None when
    fewer than two requests arrive at different times."""
    from workloads.spec import build_workload

    one = copy.deepcopy(data)
    one["workload"]["trace"].pop("target_rate", None)
    exp = parse_experiment(one, source=source)
    base_dir = Path(source).parent if source else Path.cwd()
    times = [r.arrival_s for r in build_workload(exp.workload, seed=exp.seed, base_dir=base_dir,
                                                 source=source).requests]
    span = max(times, default=0.0) - min(times, default=0.0)
    return (len(times) - 1) / span if len(times) > 1 and span > 0 else None


def build_series(data: dict[str, Any], *, source: str | None, param: str = RATE_PATH,
                 notes: list[str] | None = None) -> list[Series]:
    """One series per (variant, policy), each an experiment with that policy alone. Notes for
    the user (e.g. a trace option the search replaces) are appended to `notes`."""
    if param.endswith("trace.time_scale"):
        # Bisection assumes a larger value is more load; a larger time_scale is less.
        raise ConfigError("the search raises its parameter until the SLOs break, but a larger time_scale "
                          "is a slower trace", where="--param", found=param,
                          expected=f"{TRACE_RATE_PATH} (req/s), which capacity picks for a trace by itself")
    base = copy.deepcopy(data)
    base.pop("sweep", None)  # the search itself varies the rate; other sweeps are not combined with it
    plan = expand(base, source=source)
    series = []
    for point in plan.points:
        labels = policy_labels(point.experiment.policies)
        for label, policy in zip(labels, point.data["policies"], strict=True):
            one = copy.deepcopy(point.data)
            one["policies"] = [{**policy, "label": label}]
            # After expanding, so that a variant's own time_scale is replaced too.
            for note in _prepare_trace_rate(one, param, source):
                if notes is not None and note not in notes:
                    notes.append(note)
            _check_param(one, param, source)
            series.append(Series(len(series), point.variant, label, one))
    return series


def _check_param(data: dict[str, Any], param: str, source: str | None) -> None:
    node: Any = data
    for part in param.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"the capacity search varies {param}, which this experiment does not set "
                              "(a synthetic workload with `arrivals:`, or pass --param)", source=source)
        node = node[part]


def search(
    series: list[Series],
    slo: dict[str, float],
    out: Path,
    *,
    low: float,
    high: float,
    tol: float,
    source: str | None,
    param: str = RATE_PATH,
    jobs: int = 1,
    executor: str = "local",
    address: str | None = None,
    on_round: Callable[[int, int], None] | None = None,
) -> list[Series]:
    """Bisect every series in lockstep; each round runs all series' probes together."""
    if not 0 < low < high < math.inf:
        raise ConfigError("need 0 < --low < --high, both finite", where="--low/--high", found=f"{low}, {high}")
    if not 0 < tol < math.inf:
        raise ConfigError("--tol must be a finite number > 0", where="--tol", found=tol)
    check_tol(low, high, tol)
    store = SweepStore(out)
    # An earlier search's result goes before any probe is stored: a search killed part-way then
    # leaves no capacity.json (which is written last) describing other probes than the folder's.
    path_under(out, RESULT_FILE).unlink(missing_ok=True)
    with make_executor(executor, jobs=jobs, address=address, scratch=scratch_dir(out)) as pool:
        _bisect(series, slo, store, pool, low=low, high=high, tol=tol, source=source, param=param,
                on_round=on_round)
    return series


def check_counts(param: str, low: float, high: float) -> None:
    """A search over a number of clients needs whole-number ends (0 clients is none)."""
    if param == CONCURRENCY_PATH and not (low == int(low) and high == int(high) and low >= 1):
        raise ConfigError("the search varies clients.concurrency, a whole number of clients", where="--low/--high",
                          expected="whole numbers, at least 1", found=f"{low:g}, {high:g}")


def check_tol(low: float, high: float, tol: float) -> int:
    """The rounds a search of [low, high] down to `tol` takes (both ends, then one halving a
    round); a `tol` finer than the rates the search can tell apart is an error: the bracket
    could never get that narrow. Rates are rounded to RATE_DECIMALS, and near `high` floats are
    math.ulp(high) apart; with tol >= 4 ulps, (high - low) / tol < 2**51, so at most 52 rounds."""
    finest = max(10.0**-RATE_DECIMALS, 4 * math.ulp(high))
    if tol < finest:
        why = (f"floats near --high {high:g} are {math.ulp(high):g} apart" if finest > 10.0**-RATE_DECIMALS
               else f"probe rates are rounded to {RATE_DECIMALS} decimals")
        raise ConfigError("finer than the rates the search can tell apart", where="--tol",
                          expected=f"at least {finest:g} ({why})", found=tol)
    span = high - low
    return 1 + (math.ceil(math.log2(span / tol)) if span > tol else 0)


def _bisect(series: list[Series], slo: dict[str, float], store: SweepStore, pool: Executor, *, low: float,
            high: float, tol: float, source: str | None, param: str,
            on_round: Callable[[int, int], None] | None) -> None:
    round_no = 0
    # Round 1 probes both ends of the bracket; later rounds probe each open bracket's midpoint.
    wanted = {s.index: [low, high] for s in series}
    while wanted:
        round_no += 1
        _run_probes(series, wanted, slo, store, pool, source=source, param=param)
        wanted = {}
        for s in series:
            if s.status != "searching":
                continue
            _update(s, low, high)
            if s.status == "searching":
                if param == CONCURRENCY_PATH:
                    middle = float(math.floor(s.low + (s.high - s.low) / 2))
                else:
                    middle = round(s.low + (s.high - s.low) / 2, RATE_DECIMALS)  # no overflow near the float limit
                # No rate strictly inside the bracket (rounding, float spacing): it is as narrow as it gets.
                if s.high - s.low <= tol or not s.low < middle < s.high:
                    s.status = "ok"
                else:
                    wanted[s.index] = [middle]
        if on_round is not None:
            on_round(round_no, len(wanted))
        if wanted and round_no >= MAX_ROUNDS + 1:  # never reached: every round narrows each open bracket
            raise ServesimError(f"the capacity search did not converge in {round_no} rounds; its probes are "
                                "stored, so a re-run with a larger --tol resumes from them")


def _update(s: Series, low: float, high: float) -> None:
    if any(p.error for p in s.probes):
        s.status = "error"
        return
    passed = [p.rate for p in s.probes if p.passed]
    failed = [p.rate for p in s.probes if not p.passed]
    if s.probe_at(high) is not None and s.probe_at(high).passed:
        s.low, s.high, s.status = high, None, "at-high"
    elif s.probe_at(low) is not None and not s.probe_at(low).passed:
        s.low, s.high, s.status = None, low, "below-low"
    else:
        # Latency need not be perfectly monotone in rate; bracket by the highest pass below the lowest fail.
        s.high = min(failed)
        s.low = max([r for r in passed if r < s.high], default=low)


def _run_probes(series: list[Series], wanted: dict[int, list[float]], slo: dict[str, float], store: SweepStore,
                pool: Executor, *, source: str | None, param: str) -> None:
    points: dict[str, tuple[Series, SweepPoint]] = {}
    for s in series:
        for rate in wanted.get(s.index, []):
            point = _probe_point(s, rate, source=source, param=param)
            points[point.point_id] = (s, point)
    todo = [pid for pid in points if not store.is_done(pid)]
    abs_source = str(Path(source).resolve()) if source else None
    tasks = [PointTask(pid, points[pid][1].data, abs_source) for pid in todo]
    for output in pool.run(tasks):
        store.record(points[output.point_id][1], output)
    for pid, (s, point) in points.items():
        rate = point.values[param]
        if store.is_done(pid):
            summary = store.read_done(pid)["summaries"][0]
            s.probes.append(Probe(rate, meets(summary, slo), summary))
        else:
            s.probes.append(Probe(rate, False, {}, error=store.read_error(pid) or "no result"))


def _probe_point(s: Series, rate: float, *, source: str | None, param: str) -> SweepPoint:
    data = copy.deepcopy(s.data)
    set_dotted(data, param, int(rate) if param == CONCURRENCY_PATH else rate, source=source)
    exp = parse_experiment(copy.deepcopy(data), source=source)
    digest = hashlib.sha256(json.dumps(exp.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:10]
    point_id = f"s{s.index:02d}-r{rate:g}-{digest}"
    return SweepPoint(s.index, point_id, s.variant, {param: rate, "label": s.label}, data, exp)


def meets(summary: dict[str, Any], slo: dict[str, float]) -> bool:
    """Every request that could run finished, and every SLO metric is defined and within its
    limit. Requests rejected as they arrived (longer than max_model_len or the whole cache) are
    rejected at any rate: they are the workload's, not a sign of overload."""
    if summary.get("completed", 0) + summary.get("num_rejected_on_arrival", 0) != summary.get("num_requests"):
        return False
    return all(summary.get(k) is not None and summary[k] <= limit for k, limit in slo.items())


def write_result(result: CapacityResult, out: Path) -> Path:
    path = path_under(out, RESULT_FILE)
    write_json(path, result.as_json())
    return path
