"""`servesim compare REAL.json SIM`: simulated vs real latency percentiles, with relative errors.

REAL is a vLLM `bench serve` result JSON. SIM is a `servesim run` results folder (every policy is
compared, or those named with --policy) or another vLLM-layout JSON (e.g. from `servesim export`).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("real", type=Path, help="vLLM bench serve result JSON (--save-result)")
    parser.add_argument("sim", type=Path, help="servesim run results folder, or a vLLM-layout JSON")
    parser.add_argument("--policy", action="append", default=[], metavar="LABEL",
                        help="compare only this policy label (repeatable)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for compare.png/svg and compare.json (default: SIM/compare, or next to SIM.json)")
    parser.add_argument("--no-plot", dest="plot", action="store_false", help="print the table only")


def run(args: argparse.Namespace) -> int:
    from experiments.report_compare import compare

    print(compare(args.real, args.sim, policies=args.policy, out=args.out, plot=args.plot))
    return 0
