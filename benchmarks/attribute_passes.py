"""How to read a column of the running batch: `map` over an `attrgetter`, or a comprehension.

The fast path reads a few columns of the running batch (ids, outputs, processed positions, steps
left) for every part of a run. This times each way of reading them on batches of requests, the
same calls side by side in one process:

    PYTHONPATH=. python benchmarks/attribute_passes.py
"""

from __future__ import annotations

import argparse
import sys
import timeit
from operator import attrgetter, sub

from simcore.request import Request

_outputs_of = attrgetter("num_outputs")
_processed_of = attrgetter("num_processed")
_target_of = attrgetter("_num_target")

CASES = {
    "one column": (lambda batch: list(map(_outputs_of, batch)),
                   lambda batch: [request.num_outputs for request in batch]),
    "a column's sum": (lambda batch: sum(map(_processed_of, batch)),
                       lambda batch: sum([request.num_processed for request in batch])),
    "steps left (two columns)": (lambda batch: list(map(sub, map(_target_of, batch), map(_outputs_of, batch))),
                                 lambda batch: [request._num_target - request.num_outputs for request in batch]),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=20_000, help="passes timed together (best of 5)")
    number = parser.parse_args(argv).number
    print(f"python {sys.version.split()[0]}; microseconds a pass, best of 5 (attrgetter map / comprehension)")
    print(f"{'batch':>6} " + " ".join(f"{name:>28}" for name in CASES))
    for size in (8, 24, 64, 128):
        batch = [Request(i, 0.0, 100, 100) for i in range(size)]
        cells = []
        for by_map, by_comprehension in CASES.values():
            assert by_map(batch) == by_comprehension(batch)
            times = [min(timeit.repeat(lambda f=f, batch=batch: f(batch), number=number, repeat=5)) / number * 1e6
                     for f in (by_map, by_comprehension)]
            cells.append(f"{times[0]:6.2f} / {times[1]:5.2f} ({times[0] / times[1]:.1f}x)")
        print(f"{size:>6} " + " ".join(f"{cell:>28}" for cell in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
