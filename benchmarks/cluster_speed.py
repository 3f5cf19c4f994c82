"""Simulator speed of a cluster against one engine: N replicas with 10,000 requests each.

The reference workload of benchmarks/sim_speed.py (the Azure 2023 conversation trace's lengths,
Poisson arrivals at 4 requests/s a replica, Llama-2-7B with a 32k context on an A100-80GB,
roofline costs, chunked prefill with chunks of 512): one engine with 10,000 requests, then
N replicas behind each router with N x 10,000 requests at N times the rate (the trace's
(prompt, output) pairs resampled), and a disaggregated cluster (N/4 prefill, 3N/4 decode
replicas, InfiniBand links). Each case runs in this process, best of `--repeat`, the cases
taking turns; `x one` is its wall time over the single engine's, `cpu x one` the same of the
process's CPU time (user and system), which another process busy on the machine moves less.

    python benchmarks/cluster_speed.py                        # 8 replicas, every router
    python benchmarks/cluster_speed.py --replicas 8 --routers round_robin least_outstanding --repeat 3
    python benchmarks/cluster_speed.py --replicas 2 --requests-per-replica 500   # a quick check
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.sim_speed import experiment  # noqa: E402
from experiments.config import Experiment  # noqa: E402
from experiments.runner import run_experiment  # noqa: E402
from policies.routers import ROUTERS  # noqa: E402

RATE_PER_REPLICA = 4.0


def case(num_replicas: int, per_replica: int, router: str | None, disaggregated: bool = False) -> dict:
    """The experiment mapping of one case (one engine where `router` is None)."""
    size = num_replicas * per_replica if router is not None else per_replica
    exp = experiment(size, "chunked_prefill")
    trace = exp["workload"]["trace"]
    if size != 10_000:  # sim_speed resamples only above 10,000
        trace["sample"] = {"n": size, "seed": 1, "replace": True}
    exp["workload"]["num_requests"] = size
    if router is not None:
        exp["workload"]["arrivals"]["rate"] = RATE_PER_REPLICA * num_replicas
        if disaggregated:
            num_prefill = max(1, num_replicas // 4)
            exp["cluster"] = {"prefill_replicas": num_prefill, "decode_replicas": num_replicas - num_prefill,
                              "router": {"name": router}}
        else:
            exp["cluster"] = {"replicas": num_replicas, "router": {"name": router}}
    return exp


def timed(exp: dict) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds, requests finished, steps) of one run, without writing anything."""
    started, cpu_started = time.perf_counter(), time.process_time()
    run = run_experiment(Experiment.model_validate(exp))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    (policy_run,) = run.runs
    return wall, cpu, policy_run.summary["completed"], policy_run.summary["num_steps"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--requests-per-replica", type=int, default=10_000)
    parser.add_argument("--routers", nargs="+", default=sorted(ROUTERS), choices=sorted(ROUTERS))
    parser.add_argument("--no-disaggregated", action="store_true", help="leave out the disaggregated case")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    cases = [("one engine", case(1, args.requests_per_replica, None))]
    cases += [(f"{args.replicas} x {router}", case(args.replicas, args.requests_per_replica, router))
              for router in args.routers]
    if not args.no_disaggregated and args.replicas >= 2:
        num_prefill = max(1, args.replicas // 4)
        cases.append((f"{num_prefill}P:{args.replicas - num_prefill}D round_robin",
                      case(args.replicas, args.requests_per_replica, "round_robin", disaggregated=True)))
    best: dict[str, tuple[float, float, int, int]] = {}
    for _ in range(args.repeat):
        for name, exp in cases:
            result = timed(exp)
            if name not in best or result[0] < best[name][0]:
                best[name] = result
    one, one_cpu = best["one engine"][:2]
    print(f"{'case':<32} {'wall s':>8} {'x one':>7} {'cpu s':>8} {'cpu x one':>9} {'finished':>9} {'steps':>10}")
    for name, _ in cases:
        wall, cpu, finished, steps = best[name]
        print(f"{name:<32} {wall:8.2f} {wall / one:7.2f} {cpu:8.2f} {cpu / one_cpu:9.2f} {finished:9d} {steps:10d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
