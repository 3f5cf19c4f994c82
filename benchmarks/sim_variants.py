"""The reference workload with one scheduling option changed: where the fast path still steps.

A sweep changes the options one at a time, and each setting can leave the fast path in its own
way: a seat limit, an admission rule, memory pressure. For each variant this prints the wall
time of one run (outputs written), its events (runs of steps and arrivals, as `sim_speed.py`
counts them), its steps and its completed requests. Events against steps is the figure to
read: the reference runs take about one event for every five steps; a variant near one event a
step is mostly stepped. Events and steps repeat exactly; wall time is one run's (see
`sim_speed.py` on noise).

    python benchmarks/sim_variants.py                        # every variant, 10k requests
    python benchmarks/sim_variants.py --size 5000 --variants chunked-seats16 mixed-seats16
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim_speed import POLICIES, compile_packages, experiment  # noqa: E402

CONTINUOUS, CHUNKED = POLICIES["continuous"], POLICIES["chunked_prefill"]
# name: (the policy entry, the kv_cache section when not the reference's)
VARIANTS: dict[str, tuple[dict, dict | None]] = {
    "continuous-reserve": ({**CONTINUOUS, "admission": "reserve"}, None),
    "continuous-watermark": ({**CONTINUOUS, "admission": "watermark"}, None),
    "chunked-reserve": ({**CHUNKED, "admission": "reserve"}, None),
    "chunked-watermark": ({**CHUNKED, "admission": "watermark"}, None),
    "chunked-alternate": ({**CHUNKED, "order": "alternate"}, None),
    "static-32": ({"name": "static", "max_batch_size": 32}, None),
    "continuous-seats16": ({**CONTINUOUS, "max_num_seqs": 16}, None),
    "chunked-seats16": ({**CHUNKED, "max_num_seqs": 16}, None),
    "chunked-budget2048": ({**CHUNKED, "max_num_batched_tokens": 2048}, None),
    "chunked-seats24-budget2048": ({**CHUNKED, "max_num_seqs": 24, "max_num_batched_tokens": 2048}, None),
    "mixed-seats16": ({**CONTINUOUS, "mixed": True, "max_num_seqs": 16}, None),
    "mixed": ({**CONTINUOUS, "mixed": True}, None),
    "chunked-1000-blocks": (CHUNKED, {"num_blocks": 1000}),
    "continuous-1000-blocks": (CONTINUOUS, {"num_blocks": 1000}),
}


def run_variant(name: str, size: int) -> dict:
    """One run of a variant in this process: wall time, events, steps, completed requests."""
    from experiments.config import parse_experiment
    from experiments.runner import run_experiment

    policy, kv_cache = VARIANTS[name]
    config = experiment(size, "continuous")
    config["policies"] = [policy]
    if kv_cache is not None:
        config["kv_cache"] = kv_cache
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        (only,) = run_experiment(parse_experiment(config, source=None), source=None, out_dir=Path(tmp)).runs
    return {"wall_s": time.perf_counter() - started, "events": only.result.num_events,
            "steps": len(only.result.steps), "completed": only.summary["completed"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args(argv)
    compile_packages(ROOT)
    print(f"requests: {args.size}  python: {sys.version.split()[0]}")
    print(f"{'variant':<24} {'wall s':>7} {'events':>8} {'steps':>8} {'completed':>9}")
    for name in args.variants:
        row = run_variant(name, args.size)
        print(f"{name:<24} {row['wall_s']:7.2f} {row['events']:8d} {row['steps']:8d} {row['completed']:9d}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
