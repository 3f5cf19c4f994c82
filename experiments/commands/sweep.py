"""`servesim sweep FILE.yaml --out DIR`: run every point of an experiment's sweep/variants, resumably.

Exit status: 0 when every point is finished, 1 when any point failed (its ERROR.json says why;
the other points still ran, and a re-run retries only the failed and missing ones), 2 for a bad
experiment file or flag, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from experiments.commands.arg_types import add_no_fast_forward, fast_forward_overrides
from experiments.sweep_exec import EXECUTORS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", type=Path, help="experiment YAML file with `sweep:` and/or `variants:`")
    parser.add_argument("--out", type=Path, default=None, help="sweep folder (default: results/<name>-sweep)")
    parser.add_argument("--jobs", "-j", type=int, default=1,
                        help="points run at once (local: worker processes; 0 = one per CPU; 1 = inline)")
    parser.add_argument("--executor", choices=EXECUTORS, default="local",
                        help="local processes, or Ray tasks (needs `pip install -e '.[ray]'` in the repository)")
    parser.add_argument("--address", default=None,
                        help="Ray cluster address (e.g. ray://head:10001 or auto); default: a private local Ray")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field of every point, e.g. --set workload.num_requests=50 (repeatable)")
    add_no_fast_forward(parser)
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the folder whole when it holds other results (another plan); "
                             "a folder of the same plan is resumed without it")
    parser.add_argument("--dry-run", action="store_true", help="list the points and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from experiments.progress import progress_wanted
    from experiments.report import sweep_table
    from experiments.sweep import load_sweep
    from experiments.sweep_run import run_sweep

    overrides = [*args.overrides, *fast_forward_overrides(args)]
    plan = load_sweep(args.experiment, overrides)
    out = args.out or Path("results") / f"{plan.name}-sweep"
    jobs = args.jobs if args.jobs > 0 else (os.cpu_count() or 1)
    if args.dry_run:
        for point in plan.points:
            print(f"{point.point_id}  {point.title}")
        return 0
    if not args.quiet:
        print(f"servesim: {plan.name}: {len(plan.points)} points x {len(plan.points[0].experiment.policies)} "
              f"policies -> {out} ({args.executor}, {jobs} jobs)", file=sys.stderr)
    try:
        outcome = run_sweep(plan, out, jobs=jobs, executor=args.executor, address=args.address,
                            progress=progress_wanted(args.quiet), overwrite=args.overwrite)
    except KeyboardInterrupt:
        print("servesim: sweep interrupted; its finished points are kept and the same command resumes it",
              file=sys.stderr)
        raise
    print(sweep_table(out))
    if outcome.skipped:
        print(f"note: {len(outcome.skipped)} points were already finished and were not run again", file=sys.stderr)
    stale = outcome.store.stale_folders(plan)
    if stale:
        print(f"note: {len(stale)} folders in {out / 'points'} belong to no point of this sweep "
              "(an earlier configuration); they are ignored", file=sys.stderr)
    print(f"results: {out} (dataset: {outcome.dataset})")
    if outcome.failed:
        print(f"servesim: {len(outcome.failed)} of {outcome.num_points} points failed "
              "(see points/<id>/ERROR.json; re-run the same command to retry them):", file=sys.stderr)
        for point_id, error in outcome.failed.items():
            print(f"  {point_id}: {error.strip().splitlines()[-1]}", file=sys.stderr)
        return 1
    return 0
