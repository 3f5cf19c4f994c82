"""Simulator speed and memory on the reference workload.

Reference: the first 10,000 rows of the Azure 2023 conversation trace (bundled as
builtin:azure_conv_2023) for prompt/output lengths, Poisson arrivals at 4 requests/s (seed 0),
Llama-2-7B with its RoPE scaled linearly by 8 to a 32,768-token context (the method of Together's
LLaMA-2-7B-32K, together.ai/blog/llama-2-7b-32k; benchmarks/llama-2-7b-32k.json: the same
geometry and costs as the llama-2-7b preset, whose 4,096 tokens would reject 1,157 of the 10,000
rows, which the reference has always run) on an A100-80GB, roofline costs, continuous batching (<= 128 running, 4,096 tokens
per step) and chunked prefill (chunk 512). Larger sizes resample the trace's (prompt, output)
pairs with replacement at the same rate. Each case runs in its own process (so peak memory is
its own) and writes full per-request and per-step Parquet outputs.

    python benchmarks/sim_speed.py                      # 10k and 100k
    python benchmarks/sim_speed.py --sizes 10000 100000 1000000
    python benchmarks/sim_speed.py --sizes 10000 --repeat 5     # best and median of 5 fresh runs
    python benchmarks/sim_speed.py --sizes 10000 --trees ../before .   # two trees side by side
    python benchmarks/sim_speed.py --sizes 10000 --stepping           # also one step at a time
    python benchmarks/sim_speed.py --sizes 10000 --queue-order priority --stepping
    python benchmarks/sim_speed.py --sizes 10000 --profile-table tests/data/profiles/cpu-tiny-llama.csv
    python benchmarks/sim_speed.py --sizes 10000 --prefix-caching  # the same with the prefix cache on
    python benchmarks/sim_speed.py --sizes 10000 --policies offload  # chunked prefill with a host tier

On a shared machine one run's wall time can be 15% or more off the next one's, minutes apart. With
`--repeat N` each case runs N times, the cases (policies, modes, trees) taking turns so that a
slow spell falls on each, and the table gives the best wall and simulation-loop times, as `timeit`
does (the noise only ever adds time), and the median wall time; the runs must agree on every
count. Compare trees only side by side in one run (`--trees`): `x tree 0` is each row's best wall
time over the first tree's.

Beside the wall time, each case reports its CPU time (`cpu s`: user and system time of its
process, from the experiment's parsing to its last output file) and the CPU time the machine's
hypervisor gave to others meanwhile (`stolen s`: /proc/stat's steal counter, all CPUs together;
`-` where the system reports none): time a run may have waited for a CPU it was due.

The project's modules are compiled to bytecode first, as an install or a first run leaves them
(`--no-compile`: as found). These machines set PYTHONDONTWRITEBYTECODE=1, so nothing else writes
it, and every run would compile again the modules the simulator imports once it has started.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The packages a run imports from this tree (see the module docstring on compiling them first).
PACKAGES = ("simcore", "policies", "backends", "workloads", "experiments")

POLICIES = {
    "continuous": {"name": "continuous", "max_num_seqs": 128, "max_num_batched_tokens": 4096},
    "chunked_prefill": {"name": "chunked_prefill", "max_num_seqs": 128, "max_num_batched_tokens": 512,
                        "chunk_size": 512},
    # Not in the reference: chunked prefill whose victims swap to a host tier (16 GiB).
    "offload": {"name": "offload", "base": "chunked_prefill", "max_num_seqs": 128, "max_num_batched_tokens": 512,
                "chunk_size": 512},
}
REFERENCE_POLICIES = ["continuous", "chunked_prefill"]
HOST_MEMORY_GIB = {"offload": 16.0}
# The roofline's defaults and the device blocks when the reference was set (see `experiment`;
# no kernel floors then).
REFERENCE_ROOFLINE = {"mfu": 0.6, "mbu": 0.8, "step_overhead_s": 5e-4, "kernels_per_layer": 0}
REFERENCE_NUM_BLOCKS = 6784
# Llama-2-7B's geometry with a context that holds every row of the trace (the docstring).
LONG_LLAMA_2 = ROOT / "benchmarks" / "llama-2-7b-32k.json"


def experiment(size: int, policy: str, profile_table: str | None = None, prefix_caching: bool = False,
               queue_order: str | None = None, stepping: bool = False) -> dict:
    trace = {"path": "builtin:azure_conv_2023", "lengths_only": True}
    if size > 10_000:
        trace["sample"] = {"n": size, "seed": 1, "replace": True}
    return {
        "name": f"speed-{size}-{policy}", "seed": 0, "model": str(LONG_LLAMA_2), "hardware": "a100-80gb",
        "workload": {"trace": trace, "arrivals": {"kind": "poisson", "rate": 4.0}, "num_requests": size},
        # A profiled table from another model prices steps meaninglessly but as fast (speed only).
        # The reference's costs and capacity are pinned to what they were when it was set (the
        # roofline's defaults then; the blocks an A100 taken as 80e9 bytes held), so that trees
        # compare on one workload whatever their defaults.
        "cost_model": {"name": "roofline", **REFERENCE_ROOFLINE} if profile_table is None else
                      {"name": "profiled", "table": profile_table, "check_model": False},
        "policies": [{**POLICIES[policy], **({"queue_order": queue_order} if queue_order else {})}],
        "kv_cache": {"prefix_caching": prefix_caching, "host_memory_gib": HOST_MEMORY_GIB.get(policy, 0.0),
                     "num_blocks": REFERENCE_NUM_BLOCKS},
        "output": {"plots": False},
        **({"limits": {"fast_forward": False}} if stepping else {}),
    }


def run_case(size: int, policy: str, out: Path, profile_table: str | None = None, prefix_caching: bool = False,
             queue_order: str | None = None, stepping: bool = False) -> dict:
    """One case in this process: build, simulate, write outputs; report figures."""
    sys.path.insert(0, str(ROOT))
    from experiments.config import parse_experiment
    from experiments.runner import run_experiment

    machine_before = machine_times()
    started, cpu_started = time.perf_counter(), time.process_time()
    exp = parse_experiment(experiment(size, policy, profile_table, prefix_caching, queue_order, stepping), source=None)
    run = run_experiment(exp, source=None, out_dir=out)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    steal = stolen_seconds(machine_before, machine_times())
    (only,) = run.runs
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "size": size, "policy": policy, "wall_s": wall, "simulate_s": only.result.wall_time_s,
        "cpu_s": cpu, "steal_s": steal,
        "sim_time_s": only.result.sim_time_s, "steps": len(only.result.steps), "events": only.result.num_events,
        "peak_mib": peak_kib / 1024, "requests_per_wall_s": size / wall,
        "completed": only.summary["completed"], "rejected": only.summary["num_rejected"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--policies", nargs="+", default=REFERENCE_POLICIES, choices=list(POLICIES))
    parser.add_argument("--profile-table", help="price steps with this profiled table instead of the roofline")
    parser.add_argument("--prefix-caching", action="store_true",
                        help="with the prefix cache on (the trace has lengths only: nothing can hit)")
    parser.add_argument("--queue-order", help="the policies' queue_order (e.g. priority)")
    parser.add_argument("--stepping", action="store_true",
                        help="also run every case with limits.fast_forward: false (one step at a time)")
    parser.add_argument("--trees", type=Path, nargs="+", default=[ROOT],
                        help="run each case in each of these source trees, taking turns (default: this one); "
                             "each tree's own benchmarks/sim_speed.py runs its cases")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each case (best and median reported)")
    parser.add_argument("--no-compile", action="store_true", help="do not compile the project's bytecode first")
    parser.add_argument("--case", nargs=2, metavar=("SIZE", "POLICY"), help=argparse.SUPPRESS)
    parser.add_argument("--case-stepping", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.case:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run_case(int(args.case[0]), args.case[1], Path(tmp), args.profile_table,
                                      args.prefix_caching, args.queue_order, args.case_stepping)))
        return 0
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    trees = [tree.resolve() for tree in args.trees]
    if not args.no_compile:
        for tree in trees:
            compile_packages(tree)
    bytecode = "as found" if args.no_compile else "compiled first"
    print(f"cores: {os.cpu_count()}  python: {sys.version.split()[0]}  runs per case: {args.repeat}  "
          f"bytecode: {bytecode}")
    for index, tree in enumerate(trees):
        print(f"tree {index}: {tree}")
    median = f" {'median s':>8}" if args.repeat > 1 else ""
    ratio = f" {'x tree 0':>8}" if len(trees) > 1 else ""
    header = f"{'requests':>9} {'tree':>4} {'policy':<24} {'wall s':>8}{median}{ratio} {'sim-loop s':>10} " \
             f"{'cpu s':>8} {'stolen s':>8} {'simulated s':>12} {'steps':>9} {'events':>8} {'peak MiB':>9} " \
             f"{'req/wall s':>11}"
    print(header)
    options = ["--profile-table", str(Path(args.profile_table).resolve())] if args.profile_table else []
    if args.prefix_caching:
        options.append("--prefix-caching")
    if args.queue_order:
        options += ["--queue-order", args.queue_order]
    modes = [False, True] if args.stepping else [False]
    cases = [(policy, stepping, index) for policy in args.policies for stepping in modes for index in range(len(trees))]
    rows = []
    for size in args.sizes:
        runs: dict[tuple, list[dict]] = {case: [] for case in cases}
        for _ in range(args.repeat):
            for policy, stepping, index in cases:  # taking turns, so that a slow spell falls on each
                command = [sys.executable, str(trees[index] / "benchmarks" / "sim_speed.py"), "--case", str(size),
                           policy, *options, *(["--case-stepping"] if stepping else [])]
                done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=trees[index])
                runs[(policy, stepping, index)].append(json.loads(done.stdout.strip().splitlines()[-1]))
        for policy, stepping, index in cases:
            row = {**summarize_runs(runs[(policy, stepping, index)]), "tree": str(trees[index]), "stepping": stepping,
                   "queue_order": args.queue_order}
            rows.append(row)
            label = policy + (f" {args.queue_order}" if args.queue_order else "") + (" stepped" if stepping else "")
            median = f" {row['median_wall_s']:>8.2f}" if args.repeat > 1 else ""
            base = summarize_runs(runs[(policy, stepping, 0)])["wall_s"]
            ratio = f" {row['wall_s'] / base:>8.2f}" if len(trees) > 1 else ""
            steal = f"{row['steal_s']:>8.2f}" if row["steal_s"] is not None else f"{'-':>8}"
            print(f"{size:>9} {index:>4} {label:<24} {row['wall_s']:>8.2f}{median}{ratio} {row['simulate_s']:>10.2f} "
                  f"{row['cpu_s']:>8.2f} {steal} {row['sim_time_s']:>12.0f} {row['steps']:>9} {row['events']:>8} "
                  f"{row['peak_mib']:>9.0f} {row['requests_per_wall_s']:>11.0f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def machine_times() -> list[int] | None:
    """The machine's CPU time counters (all CPUs, in ticks: user, nice, system, idle, iowait,
    irq, softirq, steal, ...) from /proc/stat; None where there is none (not Linux)."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    return [int(value) for value in fields[1:]] if fields and fields[0] == "cpu" else None


def stolen_seconds(before: list[int] | None, after: list[int] | None) -> float | None:
    """CPU seconds that the machine's hypervisor gave to others between two readings
    (`machine_times`), all CPUs together: on a shared virtual machine, time that a run waited
    for a CPU it was due, which no change to the code can save (an idle CPU has none to give).
    None where it is not reported."""
    if before is None or after is None or len(before) < 8 or len(after) < 8:
        return None
    return (after[7] - before[7]) / os.sysconf("SC_CLK_TCK")


def compile_packages(root: Path) -> None:
    """Byte-compile the packages a run imports from the tree at `root` (see the module docstring)."""
    for package in PACKAGES:
        if not compileall.compile_dir(root / package, quiet=1):
            raise SystemExit(f"could not compile {root / package} (see above); --no-compile skips this")


def summarize_runs(runs: list[dict]) -> dict:
    """One case's row from its runs: the best wall and loop times (noise only adds time), the
    median wall time, the largest peak memory; the counts, which every run must agree on."""
    first = runs[0]
    for key in ("steps", "events", "sim_time_s", "completed", "rejected"):
        if any(run[key] != first[key] for run in runs):
            raise SystemExit(f"runs of {first['size']} {first['policy']} disagree on {key}: "
                             f"{[run[key] for run in runs]}")
    walls = sorted(run["wall_s"] for run in runs)
    best = walls[0]
    # The best run's stolen time, beside its wall time; the least CPU time (noise only adds it).
    best_run = min(runs, key=lambda run: run["wall_s"])
    return {**first, "wall_s": best, "simulate_s": min(run["simulate_s"] for run in runs),
            "cpu_s": min(run["cpu_s"] for run in runs), "steal_s": best_run["steal_s"],
            "steal_s_runs": [run["steal_s"] for run in runs],
            "median_wall_s": statistics.median(walls), "wall_s_runs": [run["wall_s"] for run in runs],
            "peak_mib": max(run["peak_mib"] for run in runs), "requests_per_wall_s": first["size"] / best}


if __name__ == "__main__":
    sys.exit(main())
