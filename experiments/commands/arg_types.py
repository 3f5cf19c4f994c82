"""argparse `type=` converters shared by the commands: a bad number is a usage error (exit 2)."""

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
