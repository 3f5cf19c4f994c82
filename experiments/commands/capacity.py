"""`servesim capacity FILE.yaml --slo ttft_p90_ms=500,tpot_p90_ms=50`: max rate meeting SLOs per policy."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from experiments.commands.arg_types import positive_float
from experiments.sweep_exec import EXECUTORS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", type=Path, help="experiment YAML file (its `variants:` are searched too)")
    parser.add_argument("--slo", required=True,
                        help="comma-separated limits in ms on summary metrics, e.g. ttft_p90_ms=500,tpot_p90_ms=50 "
                             "(metrics ttft/tpot/itl/e2el; stats mean/median/p50/p90/p95/p99)")
    parser.add_argument("--low", type=positive_float, default=0.25, help="lowest rate searched (req/s)")
    parser.add_argument("--high", type=positive_float, default=64.0, help="highest rate searched (req/s)")
    parser.add_argument("--tol", type=positive_float, default=0.1,
                        help="stop when the bracket is this narrow (req/s)")
    parser.add_argument("--param", default="workload.arrivals.rate",
                        help="the rate's dotted path (e.g. workload.trace.target_rate for a trace)")
    parser.add_argument("--out", type=Path, default=None, help="folder for probes, capacity.json and the plot "
                                                                "(default: results/<name>-capacity)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="probes run at once (0 = one per CPU)")
    parser.add_argument("--executor", choices=EXECUTORS, default="local", help="local processes or Ray tasks")
    parser.add_argument("--address", default=None, help="Ray cluster address (default: a private local Ray)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field, e.g. --set workload.num_requests=100 (repeatable)")
    parser.add_argument("--no-fast-forward", action="store_true",
                        help="take every step on its own (limits.fast_forward: false); the results are identical")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args: argparse.Namespace) -> int:
    from experiments.capacity_search import CapacityResult, build_series, check_tol, parse_slo, search, write_result
    from experiments.config import apply_overrides, load_yaml
    from experiments.io import locked_folder
    from experiments.report_capacity import capacity_table
    from experiments.report_plot_capacity import capacity_title, plot_capacity

    slo = parse_slo(args.slo)
    check_tol(args.low, args.high, args.tol)  # before anything is written
    source = str(args.experiment)
    overrides = [*args.overrides, *(["limits.fast_forward=false"] if args.no_fast_forward else [])]
    data = apply_overrides(load_yaml(args.experiment), overrides, source=source)
    if data.get("sweep") and not args.quiet:
        print("note: `sweep:` is ignored by the capacity search (it varies the rate itself)", file=sys.stderr)
    series = build_series(data, source=source, param=args.param)
    name = str(data.get("name", "experiment"))
    out = args.out or Path("results") / f"{name}-capacity"
    jobs = args.jobs if args.jobs > 0 else (os.cpu_count() or 1)

    def on_round(round_no: int, open_brackets: int) -> None:
        if not args.quiet:
            print(f"  round {round_no}: {open_brackets} of {len(series)} searches still open", file=sys.stderr)

    if not args.quiet:
        print(f"servesim: {name}: {len(series)} searches over {args.param} in [{args.low:g}, {args.high:g}] "
              f"-> {out}", file=sys.stderr)
    with locked_folder(out):
        search(series, slo, out, low=args.low, high=args.high, tol=args.tol, source=source, param=args.param,
               jobs=jobs, executor=args.executor, address=args.address, on_round=on_round)
        capacity = CapacityResult(name, slo, args.param, (args.low, args.high, args.tol), series)
        result = capacity.as_json()
        # capacity.json last: it marks the folder complete (search removed an earlier one first).
        plot_capacity(result, capacity_title(out), out)
        path = write_result(capacity, out)
    print(capacity_table(result))
    print(f"results: {path} (plot: {out / 'capacity.png'})")
    return 1 if any(s.status == "error" for s in series) else 0

