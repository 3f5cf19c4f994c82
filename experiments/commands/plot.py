"""`servesim plot DIR`: comparison plots (PNG and SVG) for a `run` or `sweep` results folder."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, help="a results folder written by `servesim run` or `servesim sweep`")
    parser.add_argument("--out", type=Path, default=None, help="where the plots go (default: DIR/plots)")
    parser.add_argument("--combos", action=argparse.BooleanOptionalAction, default=True,
                        help="for a sweep, also compare policies/variants at every combination of swept values")
    parser.add_argument("--quiet", action="store_true", help="no progress line while plotting")


def run(args: argparse.Namespace) -> int:
    from experiments.progress import elapsed, progress_wanted
    from experiments.report_plot import plot_results

    # A large sweep takes minutes to plot: say it is working.
    with elapsed(f"plotting {args.results}", enabled=progress_wanted(args.quiet)):
        paths = plot_results(args.results, args.out, combos=args.combos)
    if not paths:
        print("servesim: nothing to plot yet (no finished runs in this folder)")
        return 0
    folders = sorted({str(p.parent) for p in paths})
    print(f"{len(paths)} plot files in {', '.join(folders[:3])}" + (f" and {len(folders) - 3} more folders"
                                                                      if len(folders) > 3 else ""))
    return 0
