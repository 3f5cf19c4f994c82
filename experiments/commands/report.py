"""`servesim report DIR`: comparison tables for a `run` or `sweep` results folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.table import TABLE_STYLES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, help="a results folder written by `servesim run` or `servesim sweep`")
    parser.add_argument("--table", choices=TABLE_STYLES, default="text",
                        help="print the tables as aligned text, CSV or Markdown")


def run(args: argparse.Namespace) -> int:
    from experiments.report import report

    print(report(args.results, args.table))
    return 0
