"""Property-based fuzzing of whole experiment configs (hypothesis).

Each example draws a small valid experiment (tiny KV cache, 1-30 requests, constant or roofline
costs) and then applies 0-3 mutations: delete a key, misspell a key, replace a value by junk
(0, negative, huge, NaN, inf, wrong type, nested junk), swap a policy name / distribution kind,
or move a known key somewhere else. The property: parsing and running either succeeds, with
every request reported exactly once and sane summary numbers, or raises the project's own
`ServesimError`; never another exception and never a hang.

The YAML-text fuzzers at the end write files and only parse them, as `servesim run` does before
it runs and `servesim sweep --dry-run` does in all (thousands of cases in seconds): anchors and
aliases nested to random depth in random fields (a "billion laughs" stands for 10**10 values in
a few lines), and numbers past the float range and past the digits Python prints in every
numeric field. The property: success or a `ServesimError` naming the file, in a message of
bounded length, within PARSE_HANG_S.

Inputs that are valid but hit a known, reported limitation are counted and skipped rather than
run (see KNOWN_LIMITS below). Per-test example counts print at the end of each test (pytest -rP).
"""

from __future__ import annotations

import copy
import math
import os
import re
import resource
import signal
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments.cli import main
from experiments.config import load_raw, parse_experiment
from experiments.runner import resolve_kv, run_experiment
from experiments.sweep import expand
from simcore.errors import ServesimError
from simcore.validate import parse_yaml
from tests.helpers import HANG_S

# Many generated cases: run with `-m fuzz` (CI does; the default run leaves them out).
pytestmark = pytest.mark.fuzz

# Address space an example may add (see memory_guard): far above any example's needs (a few
# hundred MB), far below the 24 GiB of a CI machine.
MEMORY_HEADROOM = 6 * 2**30
# Valid inputs with more KV blocks than this are not run: BlockManager/HostPool build every block
# up front, about 85 and 40 bytes a block and 0.4 us each (experiments.runner.MAX_BLOCKS, 2**26 a
# tier, bounds that at some 8 GiB and 30 s); past 10**6 blocks an example takes too long.
MAX_RUN_BLOCKS = 10**6
# Synthetic sizes above these are valid but too slow for a fuzz example.
MAX_RUN_REQUESTS = 2000
# Internal errors found by fuzzing whose fix belongs to a file owned elsewhere: (label, exception
# type, message start). Each has a reproducer in tests/test_errors_regressions.py (xfail until
# fixed); here they are counted instead of failing the fuzz run. Remove an entry once fixed.
KNOWN_ISSUES: list[tuple[str, type, str]] = []

FUZZ_SETTINGS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))

MODELS = ["llama-3.1-8b", "llama-3.2-1b", "tiny-llama", "mistral-7b", "qwen2.5-7b", "llama-2-7b"]
HARDWARE = ["h100-sxm", "a100-80gb", "h200", "l4", "cpu"]
POLICY_NAMES = ["static", "continuous", "chunked_prefill", "offload"]
KINDS = ["poisson", "gamma", "constant", "burst", "fixed", "uniform", "lognormal", "normal", "empirical",
         "exponential", "zipf", "choice"]
JUNK_CONSTANTS = [
    0, -1, 1, 2, 10**12, 2**63, 10**30, -(10**12), 0.0, -0.0, 0.5, -2.5, 1e300, -1e300, 1e-300,
    math.nan, math.inf, -math.inf, True, False, None, "", "abc", "1", "1e3", "nan", "inf", [], {}, [1, 2],
    {"a": 1}, {"kind": "fixed"}, [[1]], "static", "roofline", "builtin:azure_conv_2023",
]
KNOWN_KEYS = [
    "name", "seed", "model", "hardware", "tensor_parallel", "weight_dtype", "kv_cache", "workload", "cost_model",
    "policies", "metrics", "limits", "output", "block_size", "num_blocks", "dtype", "prefix_caching",
    "host_memory_gib", "num_requests", "arrivals", "prompt_len", "output_len", "max_tokens", "prefix", "sessions",
    "trace", "rate", "cv", "kind", "value", "low", "high", "median", "sigma", "min", "max", "chunk_size",
    "max_batch_size", "max_num_seqs", "max_num_batched_tokens", "admission", "preemption", "watermark",
    "max_model_len", "delivery_ms", "slo", "ttft_ms", "max_sim_time_s", "max_wall_time_s", "check_invariants",
    "step_s", "per_token_s", "mfu", "mbu", "label", "base", "order", "mixed", "padded", "spill_prefix",
    "priority", "values", "weights",
]


# --- valid-ish experiments -------------------------------------------------------------------------

small_pos = st.floats(min_value=1e-3, max_value=50.0, allow_nan=False)


@st.composite
def lengths(draw, hi: int = 200) -> dict:
    kind = draw(st.sampled_from(["fixed", "uniform", "lognormal", "normal", "empirical"]))
    if kind == "fixed":
        return {"kind": "fixed", "value": draw(st.integers(1, hi))}
    if kind == "uniform":
        low = draw(st.integers(1, hi))
        return {"kind": "uniform", "low": low, "high": draw(st.integers(low, hi + low))}
    if kind == "lognormal":
        spec = {"kind": "lognormal", "median": draw(st.floats(1, hi)), "sigma": draw(st.floats(0, 2))}
        if draw(st.booleans()):
            spec["max"] = draw(st.integers(1, hi * 2))
            spec["min"] = draw(st.integers(1, spec["max"]))
        return spec
    if kind == "normal":
        return {"kind": "normal", "mean": draw(st.floats(-10, hi)), "std": draw(st.floats(0, 50)),
                "max": draw(st.integers(1, hi * 2))}
    return {"kind": "empirical", "values": draw(st.lists(st.integers(1, hi), min_size=1, max_size=4))}


@st.composite
def durations(draw) -> dict:
    kind = draw(st.sampled_from(["fixed", "uniform", "lognormal", "exponential"]))
    if kind == "fixed":
        return {"kind": "fixed", "value": draw(st.floats(0, 3))}
    if kind == "uniform":
        low = draw(st.floats(0, 2))
        return {"kind": "uniform", "low": low, "high": low + draw(st.floats(0, 2))}
    if kind == "lognormal":
        return {"kind": "lognormal", "median": draw(st.floats(0.01, 3)), "sigma": draw(st.floats(0, 1))}
    return {"kind": "exponential", "mean": draw(st.floats(0.01, 3))}


@st.composite
def arrivals(draw) -> dict:
    kind = draw(st.sampled_from(["poisson", "gamma", "constant", "burst"]))
    if kind == "burst":
        return {"kind": "burst", "at": draw(st.floats(0, 5))}
    spec = {"kind": kind, "rate": draw(st.floats(0.1, 1000))}
    if kind == "gamma":
        spec["cv"] = draw(st.floats(0.1, 5))
    return spec


@st.composite
def priorities(draw) -> dict:
    kind = draw(st.sampled_from(["fixed", "uniform", "choice"]))
    if kind == "fixed":
        return {"kind": "fixed", "value": draw(st.integers(-(2**31), 2**31 - 1))}
    if kind == "uniform":
        low = draw(st.integers(-5, 5))
        return {"kind": "uniform", "low": low, "high": low + draw(st.integers(0, 5))}
    values = draw(st.lists(st.integers(-3, 3), min_size=1, max_size=4))
    spec: dict[str, Any] = {"kind": "choice", "values": values}
    if draw(st.booleans()):
        spec["weights"] = draw(st.lists(st.floats(1e-300, 1e300), min_size=len(values), max_size=len(values)))
    return spec


@st.composite
def workloads(draw) -> dict:
    spec: dict[str, Any] = {
        "num_requests": draw(st.integers(1, 30)),
        "arrivals": draw(arrivals()),
        "prompt_len": draw(lengths()),
        "output_len": draw(lengths(60)),
    }
    if draw(st.integers(0, 4)) == 0:
        spec["max_tokens"] = draw(st.integers(1, 40))
    if draw(st.integers(0, 3)) == 0:
        spec["prefix"] = {"num_prefixes": draw(st.integers(1, 4)), "prefix_len": draw(lengths(100)),
                          "choice": draw(st.sampled_from([{"kind": "uniform"}, {"kind": "zipf", "s": 1.2}]).map(copy.deepcopy)),
                          "share": draw(st.floats(0, 1))}
    if draw(st.integers(0, 4)) == 0:
        spec["sessions"] = {"num_sessions": draw(st.integers(1, 5)),
                            "turns": draw(st.sampled_from([{"kind": "fixed", "value": 2},
                                                           {"kind": "uniform", "low": 1, "high": 4}]).map(copy.deepcopy)),
                            "think_time_s": draw(durations())}
    if draw(st.integers(0, 3)) == 0:
        spec["priority"] = draw(priorities())
    return spec


@st.composite
def policy_configs(draw) -> dict:
    name = draw(st.sampled_from(POLICY_NAMES))
    spec: dict[str, Any] = {"name": name}
    optional = {
        "max_num_seqs": st.integers(1, 64),
        "max_num_batched_tokens": st.integers(1, 512),
        "admission": st.sampled_from(["optimistic", "reserve", "watermark"]),
        "watermark": st.floats(0, 0.5),
        "preemption": st.sampled_from(["recompute", "swap"]),
        "max_model_len": st.integers(1, 600),
        "prefix_caching": st.booleans(),
    }
    if name == "static":  # no step scheduler's options, no prefix cache
        optional = {"max_model_len": optional["max_model_len"], "prefix_caching": st.just(False),
                    "max_batch_size": st.integers(1, 16), "padded": st.booleans()}
    elif name == "continuous":
        optional.update(mixed=st.booleans())
    elif name == "chunked_prefill":
        optional.update(chunk_size=st.integers(1, 128), order=st.sampled_from(["stall_free", "alternate"]))
    else:
        optional.update(base=st.sampled_from(["continuous", "chunked_prefill"]), chunk_size=st.integers(1, 128),
                        mixed=st.booleans(), spill_prefix=st.booleans(), preemption=st.just("swap"))
    for key, strategy in optional.items():
        if draw(st.integers(0, 2)) == 0:
            spec[key] = draw(strategy)
    return spec


@st.composite
def cost_models(draw) -> dict:
    if draw(st.booleans()):
        spec: dict[str, Any] = {"name": "constant", "step_s": draw(st.floats(1e-4, 0.05))}
        if draw(st.booleans()):
            spec["per_token_s"] = draw(st.floats(0, 1e-3))
        if draw(st.booleans()):
            spec["link_bytes_per_s"] = draw(st.floats(1e6, 1e11))
        return spec
    spec = {"name": "roofline"}
    if draw(st.booleans()):
        spec["mfu"] = draw(st.floats(0.05, 1.0))
    if draw(st.booleans()):
        spec["transfer_mode"] = draw(st.sampled_from(["serial", "overlap"]))
    return spec


@st.composite
def experiments(draw) -> dict:
    exp: dict[str, Any] = {
        "name": "fuzz",
        "seed": draw(st.integers(0, 2**32)),
        "model": draw(st.sampled_from(MODELS)),
        "hardware": draw(st.sampled_from(HARDWARE)),
        "kv_cache": {
            "block_size": draw(st.sampled_from([1, 2, 4, 8, 16, 32])),
            "num_blocks": draw(st.integers(1, 300)),
            "prefix_caching": draw(st.booleans()),
            "host_memory_gib": draw(st.sampled_from([0, 0, 0.001, 0.01, 0.05])),
        },
        "workload": draw(workloads()),
        "cost_model": draw(cost_models()),
        "policies": draw(st.lists(policy_configs(), min_size=1, max_size=3)),
        "limits": {"max_wall_time_s": 2.0, "check_invariants": draw(st.booleans())},
        "output": {"plots": False},
    }
    if exp["kv_cache"]["prefix_caching"]:  # a static entry runs without it only when told so
        for policy in exp["policies"]:
            if policy["name"] == "static":
                policy["prefix_caching"] = False
    if draw(st.integers(0, 3)) == 0:
        exp["limits"]["max_sim_time_s"] = draw(st.floats(0.001, 20))
    if draw(st.integers(0, 3)) == 0:
        exp["metrics"] = {"delivery_ms": draw(st.floats(0, 5)), "slo": {"ttft_ms": draw(st.floats(1, 1000))}}
    if draw(st.integers(0, 5)) == 0:
        exp["tensor_parallel"] = draw(st.sampled_from([1, 2, 4, 8]))
    return exp


# --- mutations --------------------------------------------------------------------------------------

junk = st.one_of(
    # Deep-copied: a mutation may edit a drawn {} or [] in place, which must not change the constant.
    st.sampled_from(JUNK_CONSTANTS).map(copy.deepcopy),
    st.integers(-5, 300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-3, 50), max_size=3),
    st.dictionaries(st.sampled_from(KNOWN_KEYS + ["zz"]), st.integers(-2, 9), max_size=2),
)


def all_paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path (dict keys and list indices) below `node`."""
    paths = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        paths.append((*prefix, key))
        paths.extend(all_paths(value, (*prefix, key)))
    return paths


def _parent(data: Any, path: tuple) -> Any:
    for key in path[:-1]:
        data = data[key]
    return data


def typo(word: str, draw) -> str:  # noqa: ANN001 - hypothesis draw
    if not word:
        return "x"
    i = draw(st.integers(0, len(word) - 1))
    how = draw(st.sampled_from(["drop", "double", "swap", "upper", "plural", "dash"]))
    if how == "drop" and len(word) > 1:
        return word[:i] + word[i + 1:]
    if how == "double":
        return word[:i] + word[i] + word[i:]
    if how == "swap" and i + 1 < len(word):
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if how == "upper":
        return word.upper()
    if how == "dash":
        return word.replace("_", "-") if "_" in word else word + "-"
    return word + "s"


@st.composite
def mutated(draw, base: st.SearchStrategy = experiments(), max_ops: int = 3) -> tuple[dict, list]:  # noqa: B008
    data = copy.deepcopy(draw(base))
    ops = []
    for _ in range(draw(st.integers(0, max_ops))):
        paths = all_paths(data)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _parent(data, path), path[-1]
        op = draw(st.sampled_from(["delete", "rename", "junk", "junk", "swap_name", "add_key", "wrap"]))
        if op == "delete":
            if isinstance(parent, list):
                parent.pop(key)
            else:
                parent.pop(key)
        elif op == "rename" and isinstance(parent, dict) and isinstance(key, str):
            parent[typo(key, draw)] = parent.pop(key)
        elif op == "swap_name":
            parent[key] = draw(st.sampled_from(POLICY_NAMES + KINDS + ["contnuous", "chunked-prefill", "Static"]))
        elif op == "add_key":
            node = parent[key]
            if isinstance(node, dict):
                node[draw(st.sampled_from(KNOWN_KEYS))] = draw(junk)
            else:
                parent[key] = draw(junk)
        elif op == "wrap":
            parent[key] = draw(st.sampled_from([[parent[key]], {"value": parent[key]}, str(parent[key])]))
        else:
            parent[key] = draw(junk)
        ops.append((op, path))
    return data, ops


# --- the harness ------------------------------------------------------------------------------------


class Hang(Exception):
    pass


@contextmanager
def hang_guard(seconds: float = HANG_S):
    def _alarm(signum, frame):  # noqa: ANN001
        raise Hang(f"an example ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def memory_guard(headroom: int = MEMORY_HEADROOM):
    """Cap the process's address space at its size now plus `headroom` while an example runs,
    so that a runaway allocation fails that example with a MemoryError, and hypothesis shows
    its input, instead of the kernel killing the test worker with no trace of it (seen once
    in CI: a worker killed at 24 GiB). Where the size cannot be read (not Linux), no cap."""
    try:
        with open("/proc/self/statm") as statm:
            size = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = size + headroom if hard == resource.RLIM_INFINITY else min(size + headroom, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _too_big(exp) -> str | None:  # noqa: ANN001
    """Why a valid experiment is not run in a fuzz example (known limits), or None."""
    spec = exp.workload
    if spec.num_requests is not None and spec.num_requests > MAX_RUN_REQUESTS and spec.trace is None:
        return "large-workload"
    if spec.sessions is not None and spec.sessions.num_sessions > MAX_RUN_REQUESTS:
        return "large-workload"
    kv = resolve_kv(exp, source=None)  # may raise ServesimError: a clean rejection
    if kv["num_blocks"] > MAX_RUN_BLOCKS or kv["num_host_blocks"] > MAX_RUN_BLOCKS:
        return "known-huge-kv"
    return None


def reported(policy_run) -> tuple[list[int], Counter]:  # noqa: ANN001 - experiments.runner.PolicyRun
    """(request ids in the requests table, count per status) of one policy's run."""
    frame = getattr(policy_run, "requests", None)
    if frame is not None:
        return [int(i) for i in frame["request_id"]], Counter(frame["status"])
    result = policy_run.result
    everyone = [*result.finished, *result.rejected, *result.unfinished]
    return [r.request_id for r in everyone], Counter(r.status.value for r in everyone)


def check_run(run) -> None:  # noqa: ANN001 - experiments.runner.ExperimentRun
    """Every request reported exactly once per policy, and the summary's defined numbers are sane."""
    num = run.info["num_requests"]
    for policy_run in run.runs:
        result, summary = policy_run.result, policy_run.summary
        ids, statuses = reported(policy_run)
        assert sorted(ids) == list(range(num)), f"{policy_run.label}: requests not reported exactly once"
        assert set(statuses) <= {"finished", "rejected", "unfinished"}, statuses
        assert result.end_reason in ("done", "max_sim_time", "max_wall_time")
        if result.end_reason == "done":
            assert statuses["unfinished"] == 0
        assert summary["num_requests"] == num
        assert summary["completed"] == statuses["finished"]
        assert summary["num_rejected"] == statuses["rejected"]
        assert summary["num_unfinished"] == statuses["unfinished"]
        for key, value in summary.items():
            if isinstance(value, float):
                assert not math.isnan(value), f"{policy_run.label}: summary {key} is NaN"
        if summary["completed"] > 0 and summary["duration"] > 0:
            for key in ("request_throughput", "output_throughput", "total_token_throughput"):
                assert summary[key] is not None and summary[key] >= 0, f"{policy_run.label}: {key}"


def run_one(data: dict, counts: Counter, *, prepare: Callable | None = None) -> None:
    """Parse and run one experiment mapping; count the outcome; fail on anything but ServesimError."""
    with hang_guard(), memory_guard():
        try:
            exp = parse_experiment(copy.deepcopy(data), source="fuzz.yaml")
        except ServesimError as exc:
            assert str(exc).startswith("fuzz.yaml"), f"message does not name the file: {exc}"
            counts["rejected-at-parse"] += 1
            return
        # A mutation may drop the wall-clock limit; keep one so no example can run away.
        if exp.limits.max_wall_time_s is None or exp.limits.max_wall_time_s > 3:
            exp.limits.max_wall_time_s = 3.0
        try:
            reason = _too_big(exp)
            if reason is not None:
                counts[f"skipped-{reason}"] += 1
                return
            if prepare is not None:
                prepare(exp)
            run = run_experiment(exp, source=None, out_dir=None)
        except ServesimError:
            counts["rejected-at-run"] += 1
            return
        except Exception as exc:
            label = known_issue(exc)
            if label is None:
                raise
            counts[f"known-issue-{label}"] += 1
            return
        check_run(run)
        counts["ran"] += 1


def known_issue(exc: BaseException) -> str | None:
    for label, kind, start in KNOWN_ISSUES:
        if type(exc) is kind and str(exc).startswith(start):
            return label
    return None


def report(name: str, counts: Counter, started: float) -> None:
    total = sum(counts.values())
    print(f"{name}: {total} examples in {time.perf_counter() - started:.1f} s: {dict(sorted(counts.items()))}")


# --- the tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("part", range(3))
def test_fuzz_mutated_experiments(part):
    """3 x 1300 random valid experiments with 0-3 mutations each."""
    counts: Counter = Counter()
    started = time.perf_counter()

    @settings(max_examples=1300, **FUZZ_SETTINGS)
    @given(mutated())
    def check(case):
        data, _ops = case
        run_one(data, counts)

    check()
    report(f"mutated experiments [{part}]", counts, started)
    assert counts["ran"] > 100 and counts["rejected-at-parse"] > 100


def test_fuzz_valid_experiments_run():
    """Unmutated random experiments: all must parse; they run or fail cleanly (e.g. tp vs heads)."""
    counts: Counter = Counter()
    started = time.perf_counter()

    @settings(max_examples=1200, **FUZZ_SETTINGS)
    @given(experiments())
    def check(data):
        run_one(data, counts)
        assert counts["rejected-at-parse"] == 0, "a valid experiment was rejected"

    check()
    report("valid experiments", counts, started)
    assert counts["ran"] > 500


def test_fuzz_heavy_mutation():
    """Many mutations on one experiment: deep junk in every section."""
    counts: Counter = Counter()
    started = time.perf_counter()

    @settings(max_examples=1000, **FUZZ_SETTINGS)
    @given(mutated(max_ops=8))
    def check(case):
        run_one(case[0], counts)

    check()
    report("heavy mutation", counts, started)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the process size from /proc")
def test_memory_guard_turns_a_runaway_allocation_into_an_error():
    """Within the guard an allocation past the headroom fails; after it, the old limit is back."""
    before = resource.getrlimit(resource.RLIMIT_AS)
    with pytest.raises(MemoryError), memory_guard(headroom=256 * 2**20):
        bytearray(2**31)
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    with memory_guard(headroom=256 * 2**20):
        small = bytearray(2**20)  # well within the headroom
    assert len(small) == 2**20 and len(bytearray(2**29)) == 2**29


# --- YAML text: aliases, and numbers past the float range (parse and sweep expansion only) ----------

# Per-file bound for parsing and expanding a small file: milliseconds when all is well. Before the
# YAML limits, an alias bomb in a field that fails validation ran for ever (its error message
# printed the value with every alias written out).
PARSE_HANG_S = 10.0
# Longest message a rejection may have: messages name the value, never print all of it.
MAX_MESSAGE_CHARS = 2000
# Files per fuzzer: about 10 ms each (drawing, writing, reading once, parsing and expanding).
ALIAS_EXAMPLES = 400
HUGE_EXAMPLES = 400
# PyYAML's C emitter when built with libyaml (writing is not under test, reading always is
# servesim's own loader).
FAST_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
# Numbers as YAML text: past float range, past int64, past the 4,300 digits Python prints
# (decimal, hex, octal, binary), overflowing and underflowing floats, and quoted strings that a
# number field may try to read as numbers.
HUGE_NUMBER_TEXTS = [
    "1" + "0" * 400, "-1" + "0" * 400, "9" * 4300, "9" * 4301, "-" + "9" * 6000, str(2**1024), str(-(2**1024)),
    str(2**63), str(2**64), str(-(2**63) - 1), "1_000_000_000_000_000_000_000", "0x" + "f" * 300, "0x" + "f" * 4000,
    "0b" + "1" * 20000, "0o" + "7" * 5000, "1.0e+400", "-1.0e+400", "1.0e-400", "1.0e+999999999", "4.9e-324",
    ".inf", "-.inf", ".nan", "1e400", "'1e999999'", "'-1e400'", "'0x" + "f" * 400 + "'", "'" + "9" * 5000 + "'",
    "'1" + "0" * 400 + "'",
]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _dotted(path: tuple) -> str:
    return ".".join(str(part) for part in path)


def _rich_experiment() -> dict:
    """An experiment with a number in every numeric field the schema has (but traces')."""
    return {
        "seed": 1, "tensor_parallel": 1,
        "kv_cache": {"block_size": 16, "num_blocks": 64, "gpu_memory_utilization": 0.9, "host_memory_gib": 0.01},
        "workload": {
            "num_requests": 5, "max_tokens": 16,
            "arrivals": {"kind": "gamma", "rate": 2.0, "cv": 1.5},
            "prompt_len": {"kind": "lognormal", "median": 32.0, "sigma": 0.5, "min": 1, "max": 64},
            "output_len": {"kind": "uniform", "low": 1, "high": 8},
            "prefix": {"num_prefixes": 2, "prefix_len": {"kind": "normal", "mean": 8.0, "std": 1.0, "max": 16},
                       "choice": {"kind": "zipf", "s": 1.1}, "share": 0.5},
            "priority": {"kind": "choice", "values": [0, 1], "weights": [0.5, 1.5]},
        },
        "cost_model": {"name": "constant", "step_s": 0.01, "per_token_s": 0.0001},
        "policies": [
            {"name": "static", "max_batch_size": 4, "max_model_len": 128},
            {"name": "offload", "max_num_seqs": 8, "max_num_batched_tokens": 64, "watermark": 0.1, "chunk_size": 32},
        ],
        "metrics": {"delivery_ms": 1.0, "slo": {"ttft_ms": 100.0, "tpot_ms": 10.0, "e2el_ms": 1000.0}},
        "limits": {"max_sim_time_s": 10.0, "max_wall_time_s": 5.0},
        "sweep": {"workload.arrivals.rate": [1.0, 2.0], "policy.max_num_seqs": [4]},
        "variants": {"a": {"kv_cache.block_size": 8}},
    }


def _sessions_experiment() -> dict:
    data = _rich_experiment()
    workload = data["workload"]
    del workload["prefix"], workload["num_requests"]
    workload["sessions"] = {"num_sessions": 3, "turns": {"kind": "empirical", "values": [1, 2]},
                            "think_time_s": {"kind": "lognormal", "median": 1.0, "sigma": 0.5, "max": 9.0},
                            "message_len": {"kind": "fixed", "value": 4}}
    return data


# Bases for the YAML fuzzers: the two above (every numeric field) or a random experiment.
bases = st.one_of(st.sampled_from([_rich_experiment(), _sessions_experiment()]).map(copy.deepcopy), experiments())


@st.composite
def with_sweep(draw, base: st.SearchStrategy = bases) -> dict:
    """An experiment with, half the time, a small `sweep:` over its numbers and `variants:`."""
    data = draw(base)
    numeric = [p for p in all_paths(data)
               if _is_number(_get(data, p)) and p[0] not in ("limits", "output", "sweep", "variants")]
    if numeric and draw(st.integers(0, 3)) == 2:
        path = draw(st.sampled_from(numeric))
        data["variants"] = {"a": {}, "b": {_dotted(path): _get(data, path)}}
    if numeric and draw(st.booleans()):
        keys = draw(st.lists(st.sampled_from(numeric), min_size=1, max_size=3, unique=True))
        sweep: dict[str, Any] = {}
        for path in keys:
            key = _dotted(path)
            if path[0] == "policies" and draw(st.booleans()):
                key = "policy." + _dotted(path[2:])  # every policy that has the field
            sweep[key] = draw(st.lists(st.sampled_from([_get(data, path), 1, 2, 8, 0.5]), min_size=1, max_size=3))
        if len(sweep) > 1 and draw(st.booleans()) and len({len(v) for v in sweep.values()}) == 1:
            sweep["mode"] = "zip"
        data["sweep"] = sweep
    return data


def _get(data: Any, path: tuple) -> Any:
    return _parent(data, path)[path[-1]]


@st.composite
def repeated_values(draw) -> Any:
    """One value repeated `width` times per level for `depth` levels: up to 12**10 values written
    out, a few lines of YAML (the dumper writes every repeat as an alias of the first); or, now
    and then, one value nested 100-150 levels deep."""
    node = draw(st.one_of(junk, st.integers(1, 64), lengths()))
    if draw(st.integers(0, 9)) == 5:
        for _ in range(draw(st.integers(100, 150))):
            node = [node]
        return node
    for _ in range(draw(st.integers(1, 10))):
        width = draw(st.integers(1, 12))
        node = [node] * width if draw(st.booleans()) else dict.fromkeys((f"k{i}" for i in range(width)), node)
    return node


@st.composite
def alias_files(draw) -> tuple[str, list[str]]:
    """(YAML text, what was done): an experiment whose fields share values through anchors and
    aliases: as people write them (prompt_len: &len {...}, output_len: *len), nested bombs in
    1-3 random fields (the same bomb in each), sweep values and cost-model parameters, or a
    value that contains itself."""
    data = draw(with_sweep())
    done = []
    if draw(st.booleans()):  # benign: valid, and must stay so
        data["workload"]["output_len"] = data["workload"]["prompt_len"]
        done.append("shared-lengths")
    paths = all_paths(data)  # once: afterwards the data may be huge written out, or cyclic
    bomb = draw(repeated_values())
    targets = draw(st.lists(st.sampled_from(paths), max_size=3, unique=True))
    for path in sorted(targets, key=len, reverse=True):  # deepest first: no path goes through a bomb
        _parent(data, path)[path[-1]] = bomb if draw(st.booleans()) else draw(repeated_values())
        done.append("bomb-in-" + str(path[0]))
    # (Middle values: hypothesis draws the ends of a range more often than the rest.)
    if draw(st.integers(0, 3)) == 2:
        key = draw(st.sampled_from(["seed", "workload.arrivals", "policy.max_num_seqs", "kv_cache.num_blocks"]))
        data["sweep"] = {key: [bomb, 1]}
        done.append("bomb-in-sweep")
    if draw(st.integers(0, 3)) == 2:
        data["cost_model"] = {"name": "constant", "step_s": bomb}  # parameters are checked by the factory
        done.append("bomb-in-cost-model")
    if draw(st.integers(0, 9)) == 5:
        loop: list = [1]
        loop.append(loop if draw(st.booleans()) else [loop])
        _parent(data, paths[0])[paths[0][-1]] = loop
        done.append("cycle")
    flow = draw(st.sampled_from([False, None, True]))
    return yaml.dump(data, Dumper=FAST_DUMPER, sort_keys=False, default_flow_style=flow), done


@st.composite
def huge_number_files(draw) -> tuple[str, list[str]]:
    """(YAML text, fields changed): 1-3 numbers of an experiment (its sweep and variants too)
    written as one of HUGE_NUMBER_TEXTS."""
    data = draw(with_sweep())
    numeric = [p for p in all_paths(data) if _is_number(_get(data, p))]
    chosen = draw(st.lists(st.sampled_from(numeric), min_size=1, max_size=3, unique=True))
    texts = []
    for i, path in enumerate(chosen):
        _parent(data, path)[path[-1]] = f"__HUGE{i}__"  # a plain scalar, replaced in the text below
        texts.append(draw(st.sampled_from(HUGE_NUMBER_TEXTS)))
    text = yaml.dump(data, Dumper=FAST_DUMPER, sort_keys=False, default_flow_style=draw(st.sampled_from([False, None])))
    return re.sub(r"__HUGE(\d+)__", lambda m: texts[int(m.group(1))], text), [_dotted(p) for p in chosen]


def parse_file(path: Path, counts: Counter) -> None:
    """One file through the file loader, then `servesim run`'s parse of it (load_experiment) and
    `servesim sweep --dry-run`'s expansion (load_sweep): each succeeds or raises a ServesimError
    naming the file in a bounded message. (The file is read once for both: YAML is the slow part.)"""
    source = str(path)
    try:
        data = load_raw(path)
    except ServesimError as exc:
        check_message(exc, source)
        problem = re.search(r"(YAML too large|YAML too deep|invalid YAML)", str(exc))
        counts[f"rejected-by-loader ({problem.group(1) if problem else 'other'})"] += 1
        return
    for stage, parse in (("run", parse_experiment), ("sweep", expand)):
        try:
            parse(copy.deepcopy(data), source=source)
        except ServesimError as exc:
            check_message(exc, source)
            counts[f"{stage}-rejected"] += 1
        else:
            counts[f"{stage}-ok"] += 1


def check_message(exc: ServesimError, source: str) -> None:
    message = str(exc)
    assert message.startswith(source), f"message does not name the file: {message[:300]}"
    assert len(message) <= MAX_MESSAGE_CHARS, f"message of {len(message)} characters: {message[:300]}..."


def fuzz_files(tmp_path: Path, name: str, strategy: st.SearchStrategy, examples: int) -> Counter:
    counts: Counter = Counter()
    started = time.perf_counter()
    path = tmp_path / "fuzz.yaml"

    @settings(max_examples=examples, **FUZZ_SETTINGS)
    @given(strategy)
    def check(case):
        text, _done = case
        path.write_text(text)
        with hang_guard(PARSE_HANG_S), memory_guard():
            parse_file(path, counts)

    check()
    report(f"{name} ({examples} files)", counts, started)
    return counts


def test_fuzz_alias_heavy_yaml(tmp_path):
    """Files with anchors and aliases in random fields, nested bombs among them."""
    counts = fuzz_files(tmp_path, "alias-heavy YAML", alias_files(), ALIAS_EXAMPLES)
    assert counts["run-ok"] > ALIAS_EXAMPLES // 20, "too few files parsed: are harmless aliases refused?"
    assert counts["rejected-by-loader (YAML too large)"] > ALIAS_EXAMPLES // 20


def test_fuzz_huge_numbers_yaml(tmp_path):
    """Files with numbers past the float range (or past printing) in random numeric fields."""
    counts = fuzz_files(tmp_path, "huge numbers in YAML", huge_number_files(), HUGE_EXAMPLES)
    assert counts["run-rejected"] > HUGE_EXAMPLES // 4
    assert counts["rejected-by-loader (invalid YAML)"] > HUGE_EXAMPLES // 20


def test_huge_numbers_in_every_numeric_field(tmp_path):
    """Every number of two experiments that between them set every numeric field (traces aside),
    replaced in turn by each of HUGE_NUMBER_TEXTS as read from YAML: parsing and sweep expansion
    succeed or raise a ServesimError in a bounded message."""
    counts: Counter = Counter()
    started = time.perf_counter()
    values = []
    for text in HUGE_NUMBER_TEXTS:  # each through the YAML loader once
        try:
            values.append(parse_yaml(f"x: {text}", source="fuzz.yaml")["x"])
            counts["yaml-read"] += 1
        except ServesimError as exc:
            assert len(str(exc)) <= MAX_MESSAGE_CHARS
            counts["yaml-refused"] += 1
    num_fields = 0
    for base in (_rich_experiment(), _sessions_experiment()):
        parse_experiment(copy.deepcopy(base), source="fuzz.yaml")  # the base is valid
        numeric = [p for p in all_paths(base) if _is_number(_get(base, p))]
        num_fields += len(numeric)
        for path in numeric:
            for value in values:
                data = copy.deepcopy(base)
                _parent(data, path)[path[-1]] = value
                with hang_guard(PARSE_HANG_S):
                    for stage, parse in (("parse", parse_experiment), ("expand", expand)):
                        try:
                            parse(copy.deepcopy(data), source="fuzz.yaml")
                            counts[f"{stage}-ok"] += 1
                        except ServesimError as exc:
                            assert str(exc).startswith("fuzz.yaml") and len(str(exc)) <= MAX_MESSAGE_CHARS, str(exc)[:300]
                            counts[f"{stage}-rejected"] += 1
    report(f"huge numbers, every numeric field ({num_fields} fields x {len(values)} values)", counts, started)
    assert counts["yaml-refused"] >= 4 and counts["parse-rejected"] > counts["parse-ok"]


def test_billion_laughs_sweep_dry_run_ends(tmp_path, capsys):
    """The reported file: 9 nested alias levels (9**9 values written out) in a field that fails
    validation made `servesim sweep --dry-run` run for ever; now the YAML is refused, in well
    under a second, naming the file and the line of the anchor whose value is too large."""
    levels = ["  l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]
    text = "\n".join([
        "name: lol", "workload:", "  num_requests: 5", "  arrivals: {kind: poisson, rate: 1}",
        "  prompt_len: {kind: fixed, value: 3}", "  output_len: {kind: fixed, value: 3}",
        "policies: [{name: continuous}]", "sweep:", *levels, "variants: {v: {seed: *l8}}", "",
    ])
    assert len(text) < 800
    path = tmp_path / "lol.yaml"
    path.write_text(text)
    started = time.perf_counter()
    with hang_guard(PARSE_HANG_S), memory_guard():
        assert main(["sweep", str(path), "--dry-run"]) == 2
    assert time.perf_counter() - started < HANG_S
    message = capsys.readouterr().err
    assert f"{path}: line 15, column 7: YAML too large" in message, message
