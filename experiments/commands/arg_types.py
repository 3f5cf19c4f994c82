"""argparse pieces shared by the commands: `type=` converters (a bad number is a usage error,
exit 2), and the flags several commands take."""

from __future__ import annotations

import argparse
import math


def positive_float(text: str) -> float:
    """A finite number > 0. float() also reads 'nan' and 'inf', which no flag of ours means."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, found {text!r}") from None
    if not 0 < value < math.inf:  # NaN fails every comparison, so it lands here too
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, found {text!r}")
    return value


def add_no_fast_forward(parser: argparse.ArgumentParser) -> None:
    """`--no-fast-forward`: the plain loop (`fast_forward_overrides` turns it into a field)."""
    parser.add_argument("--no-fast-forward", action="store_true",
                        help="take every step on its own (limits.fast_forward: false); the results are identical")


def fast_forward_overrides(args: argparse.Namespace) -> list[str]:
    """The experiment field that `--no-fast-forward` sets, as a `--set` override (none without it)."""
    return ["limits.fast_forward=false"] if args.no_fast_forward else []
