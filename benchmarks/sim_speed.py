"""Simulator speed and memory on the reference workload (issue: 10k requests in about a second).

Reference: the first 10,000 rows of the Azure 2023 conversation trace (bundled as
builtin:azure_conv_2023) for prompt/output lengths, Poisson arrivals at 4 requests/s (seed 0),
Llama-2-7B on an A100-80GB, roofline costs, continuous batching (<= 128 running, 4,096 tokens
per step) and chunked prefill (chunk 512). Larger sizes resample the trace's (prompt, output)
pairs with replacement at the same rate. Each case runs in its own process (so peak memory is
its own) and writes full per-request and per-step Parquet outputs.

    python benchmarks/sim_speed.py                      # 10k and 100k
    python benchmarks/sim_speed.py --sizes 10000 100000 1000000
    python benchmarks/sim_speed.py --sizes 10000 --profile-table tests/data/profiles/cpu-tiny-llama.csv
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

POLICIES = {
    "continuous": {"name": "continuous", "max_num_seqs": 128, "max_num_batched_tokens": 4096},
    "chunked_prefill": {"name": "chunked_prefill", "max_num_seqs": 128, "max_num_batched_tokens": 512,
                        "chunk_size": 512},
}


def experiment(size: int, policy: str, profile_table: str | None = None) -> dict:
    trace = {"path": "builtin:azure_conv_2023", "lengths_only": True}
    if size > 10_000:
        trace["sample"] = {"n": size, "seed": 1, "replace": True}
    return {
        "name": f"speed-{size}-{policy}", "seed": 0, "model": "llama-2-7b", "hardware": "a100-80gb",
        "workload": {"trace": trace, "arrivals": {"kind": "poisson", "rate": 4.0}, "num_requests": size},
        # A profiled table from another model prices steps meaninglessly but as fast (speed only).
        "cost_model": {"name": "roofline"} if profile_table is None else
                      {"name": "profiled", "table": profile_table, "check_model": False},
        "policies": [POLICIES[policy]],
        "output": {"plots": False},
    }


def run_case(size: int, policy: str, out: Path, profile_table: str | None = None) -> dict:
    """One case in this process: build, simulate, write outputs; report figures."""
    sys.path.insert(0, str(ROOT))
    from experiments.config import parse_experiment
    from experiments.runner import run_experiment

    started = time.perf_counter()
    exp = parse_experiment(experiment(size, policy, profile_table), source=None)
    run = run_experiment(exp, source=None, out_dir=out)
    wall = time.perf_counter() - started
    (only,) = run.runs
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "size": size, "policy": policy, "wall_s": wall, "simulate_s": only.result.wall_time_s,
        "sim_time_s": only.result.sim_time_s, "steps": len(only.result.steps), "events": only.result.num_events,
        "peak_mib": peak_kib / 1024, "requests_per_wall_s": size / wall,
        "completed": only.summary["completed"], "rejected": only.summary["num_rejected"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--profile-table", help="price steps with this profiled table instead of the roofline")
    parser.add_argument("--case", nargs=2, metavar=("SIZE", "POLICY"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.case:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run_case(int(args.case[0]), args.case[1], Path(tmp), args.profile_table)))
        return 0
    print(f"cores: {os.cpu_count()}  python: {sys.version.split()[0]}")
    header = f"{'requests':>9} {'policy':<16} {'wall s':>8} {'sim-loop s':>10} {'simulated s':>12} {'steps':>9} " \
             f"{'events':>8} {'peak MiB':>9} {'req/wall s':>11}"
    print(header)
    rows = []
    for size in args.sizes:
        for policy in args.policies:
            table = ["--profile-table", str(Path(args.profile_table).resolve())] if args.profile_table else []
            done = subprocess.run([sys.executable, __file__, "--case", str(size), policy, *table], capture_output=True,
                                  text=True, check=True)
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{size:>9} {policy:<16} {row['wall_s']:>8.2f} {row['simulate_s']:>10.2f} {row['sim_time_s']:>12.0f} "
                  f"{row['steps']:>9} {row['events']:>8} {row['peak_mib']:>9.0f} {row['requests_per_wall_s']:>11.0f}",
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
