"""`servesim report DIR`: comparison tables for a `run` or `sweep` results folder."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, help="a results folder written by `servesim run` or `servesim sweep`")


def run(args: argparse.Namespace) -> int:
    from experiments.report import report

    print(report(args.results))
    return 0
