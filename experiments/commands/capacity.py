"""`servesim capacity FILE.yaml --slo ttft_p90_ms=500,tpot_p90_ms=50`: max rate meeting SLOs per policy."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from experiments.commands.arg_types import add_no_fast_forward, fast_forward_overrides, positive_float
from experiments.sweep_exec import EXECUTORS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", type=Path, help="experiment YAML file (its `variants:` are searched too)")
    parser.add_argument("--slo", required=True,
                        help="comma-separated limits in ms on summary metrics, e.g. ttft_p90_ms=500,tpot_p90_ms=50 "
                             "(metrics ttft/tpot/itl/e2el; stats mean/median/p50/p90/p95/p99)")
    parser.add_argument("--low", type=positive_float, default=None,
                        help="lowest rate searched (req/s; default 0.25), or number of clients (default 1)")
    parser.add_argument("--high", type=positive_float, default=None,
                        help="highest rate searched (req/s; default 64), or number of clients (default 256)")
    parser.add_argument("--tol", type=positive_float, default=0.1,
                        help="stop when the bracket is this narrow (req/s)")
    parser.add_argument("--param", default=None,
                        help="the rate's dotted path (default: clients.concurrency with closed-loop clients, "
                             "else workload.arrivals.rate, or for a timed trace workload.trace.target_rate, its mean "
                             "arrival rate in req/s)")
    parser.add_argument("--out", type=Path, default=None, help="folder for probes, capacity.json and the plot "
                                                                "(default: results/<name>-capacity)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="probes run at once (0 = one per CPU)")
    parser.add_argument("--executor", choices=EXECUTORS, default="local", help="local processes or Ray tasks")
    parser.add_argument("--address", default=None, help="Ray cluster address (default: a private local Ray)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field, e.g. --set workload.num_requests=100 (repeatable)")
    add_no_fast_forward(parser)
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the folder whole when it holds other results than a capacity search's "
                             "(without it, a capacity folder's finished probes are reused)")
    parser.add_argument("--quiet", action="store_true", help="no progress (bar or lines)")


def run(args: argparse.Namespace) -> int:
    from experiments.capacity_search import (
        CONCURRENCY_PATH,
        RESULT_FILE,
        TRACE_RATE_PATH,
        CapacityResult,
        build_series,
        check_counts,
        check_tol,
        choose_param,
        parse_slo,
        search,
        trace_rate,
        write_result,
    )
    from experiments.config import apply_overrides, load_yaml
    from experiments.io import check_replaceable, locked_folder, replace_folder, resumed_staging
    from experiments.progress import progress_bar, progress_wanted
    from experiments.report_capacity import capacity_table
    from experiments.report_plot_capacity import capacity_title, plot_capacity
    from experiments.sweep_store import SweepStore

    slo = parse_slo(args.slo)
    source = str(args.experiment)
    overrides = [*args.overrides, *fast_forward_overrides(args)]
    data = apply_overrides(load_yaml(args.experiment), overrides, source=source)
    param = args.param or choose_param(data, source=source)
    counts = param == CONCURRENCY_PATH
    low = args.low if args.low is not None else (1.0 if counts else 0.25)
    high = args.high if args.high is not None else (256.0 if counts else 64.0)
    args.low, args.high = low, high
    check_counts(param, low, high)
    check_tol(low, high, args.tol)  # before anything is written
    if data.get("sweep") and not args.quiet:
        print("note: `sweep:` is ignored by the capacity search (it varies the rate itself)", file=sys.stderr)
    notes: list[str] = []
    series = build_series(data, source=source, param=param, notes=notes)
    if param == TRACE_RATE_PATH and not args.quiet:
        own = trace_rate(series[0].data, source=source)
        if own is not None:
            where = ("inside" if args.low <= own <= args.high
                     else "outside; set --low/--high around it")
            notes.append(f"the trace's own mean rate is {own:.4g} req/s ({where} the searched "
                         f"[{args.low:g}, {args.high:g}])")
    if not args.quiet:
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    name = str(data.get("name", "experiment"))
    out = args.out or Path("results") / f"{name}-capacity"
    jobs = args.jobs if args.jobs > 0 else (os.cpu_count() or 1)

    drawing = progress_wanted(args.quiet)

    def on_round(round_no: int, open_brackets: int) -> None:
        if drawing:
            bar.n = len(series) - open_brackets
            bar.set_postfix_str(f"round {round_no}")
        elif not args.quiet:
            print(f"  round {round_no}: {open_brackets} of {len(series)} searches still open", file=sys.stderr)

    if not args.quiet:
        print(f"servesim: {name}: {len(series)} searches over {param} in [{args.low:g}, {args.high:g}] "
              f"-> {out}", file=sys.stderr)
    with locked_folder(out):
        # The search runs beside --out and is swapped into place when complete, so --out keeps
        # the previous complete search meanwhile. Its probes are a cache keyed by their whole
        # configuration: those of a capacity folder are reused (hard links), and an interrupted
        # search resumes from the probes it stored beside --out.
        reuse = _is_capacity_folder(out) and not args.overwrite
        if not reuse:
            check_replaceable(out, overwrite=args.overwrite, what="capacity search")
        staged = resumed_staging(out)
        if reuse:
            SweepStore(staged).adopt_points(SweepStore(out))
        # On a terminal a bar counts the searches closed; in a log, a line per round.
        with progress_bar(len(series), "  searches", unit="search", enabled=drawing) as bar:
            search(series, slo, staged, low=args.low, high=args.high, tol=args.tol, source=source, param=param,
                   jobs=jobs, executor=args.executor, address=args.address, on_round=on_round)
        capacity = CapacityResult(name, slo, param, (args.low, args.high, args.tol), series)
        result = capacity.as_json()
        # capacity.json last: it marks the folder complete (search removed an earlier one first).
        plot_capacity(result, capacity_title(staged), staged)
        write_result(capacity, staged)
        replace_folder(staged, out)
    path = out / RESULT_FILE
    print(capacity_table(result))
    print(f"results: {path} (plot: {out / 'capacity.png'})")
    return 1 if any(s.status == "error" for s in series) else 0



def _is_capacity_folder(folder: Path) -> bool:
    """Empty, or written by `servesim capacity` (its probes, and capacity.json once complete)."""
    from experiments.capacity_search import RESULT_FILE
    from experiments.io import is_empty_folder

    if is_empty_folder(folder):
        return True
    if (folder / RESULT_FILE).is_file():
        return True
    return (folder / "points").is_dir() and not any((folder / name).exists() for name in ("sweep.json", "summary.json"))
