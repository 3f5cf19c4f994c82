"""What the fast path's runs are made of on the reference workload: parts by kind, their decoders.

A run of steps taken at once (one event) is one or more parts (`policies.stretch.Stretch`): a
prompt's chunks beside the decodes, then the decodes after its last chunk, say. A part costs a
fixed amount of planning, pricing, applying and recording, and a little more for each decoder in
it; this script counts the parts by kind and the decoders they carry, and times each part's
`apply_stretch` and the planning of each part that follows another (`Stretch.next_part`),
so that a change to the fast path can be aimed at the parts that cost.

    python benchmarks/run_parts.py                      # 10k reference requests, both policies
    python benchmarks/run_parts.py --size 100000 --policies chunked_prefill

Kinds: `P` a prompt's chunks (`a`: the part admits it; `T`: its last chunk is in the part; `Nw`:
its last step admits the next request), `Nw` alone a step that only admits (continuous
batching), `D` decodes only; `r` runs past finishes, `v` preempts first, `R` a readmission
cycle; then `1`, `2` or `+` (three steps or more); `&` joins a part and the one after it that
are applied as one (`apply_joined`: a prompt's last chunk, then its decodes). The times come
from wrapping those methods (a microsecond or so each), in this process: read them side by side,
not as the run's wall time (`sim_speed.py`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim_speed import REFERENCE_POLICIES, compile_packages, experiment  # noqa: E402


def part_kind(part, num_steps: int) -> str:  # noqa: ANN001 - a Stretch
    """The part's kind, as the module docstring spells it, for its first `num_steps` steps."""
    kind = ""
    if part.prefill is not None:
        kind = "P" + "a" * part.admits + "T" * part.reaches_tail(num_steps) + "Nw" * part.admits_newcomer(num_steps)
    elif part.newcomer is not None:
        kind = "Nw"
    else:
        kind = "D"
    kind += "r" * (part.remaining is not None) + "v" * bool(part.victims) + "R" * bool(part.readmits)
    return kind + ("1" if num_steps == 1 else "2" if num_steps == 2 else "+")


def survey(size: int, policy: str) -> dict:
    """Run the reference workload of `size` requests under `policy` with the two methods
    wrapped; the parts by kind (count, decoders, steps, apply seconds) and the totals."""
    from experiments.config import parse_experiment
    from experiments.runner import run_experiment
    from policies.fast_path import StretchMixin
    from policies.stretch import Stretch

    by_kind: dict[str, Counter] = {}
    planned = Counter()
    apply_stretch, apply_joined, next_part = StretchMixin.apply_stretch, StretchMixin.apply_joined, Stretch.next_part

    def tally(kind: str, num_decoders: int, num_steps: int, started: float) -> None:
        row = by_kind.setdefault(kind, Counter())
        row["parts"] += 1
        row["decoders"] += num_decoders
        row["steps"] += num_steps
        row["seconds"] += time.perf_counter() - started

    def timed_apply(self, part, step_ends):  # noqa: ANN001, ANN202
        started = time.perf_counter()
        done = apply_stretch(self, part, step_ends)
        tally(part_kind(part, len(step_ends)), len(part.decoders), len(step_ends), started)
        return done

    def timed_joined(self, part, then, step_ends):  # noqa: ANN001, ANN202
        started = time.perf_counter()
        done = apply_joined(self, part, then, step_ends)
        kind = f"{part_kind(part, part.num_steps)}&{part_kind(then, len(step_ends) - part.num_steps)}"
        tally(kind, len(then.decoders), len(step_ends), started)
        return done

    def timed_next_part(self):  # noqa: ANN001, ANN202
        if self.plan_then is None:  # planned already, or none follows
            return next_part(self)
        started = time.perf_counter()
        part = next_part(self)
        planned["seconds"] += time.perf_counter() - started
        planned["plans"] += 1
        planned["parts"] += part is not None
        return part

    StretchMixin.apply_stretch, StretchMixin.apply_joined = timed_apply, timed_joined
    Stretch.next_part = timed_next_part
    try:
        exp = parse_experiment(experiment(size, policy), source=None)
        with tempfile.TemporaryDirectory() as tmp:
            run = run_experiment(exp, source=None, out_dir=Path(tmp))
    finally:
        StretchMixin.apply_stretch, StretchMixin.apply_joined = apply_stretch, apply_joined
        Stretch.next_part = next_part
    (only,) = run.runs
    return {"policy": policy, "events": only.result.num_events, "steps": len(only.result.steps),
            "by_kind": by_kind, "next_part": planned}


def report(figures: dict, top: int) -> None:
    by_kind = figures["by_kind"]
    parts = sum(row["parts"] for row in by_kind.values())
    decoders = sum(row["decoders"] for row in by_kind.values())
    steps_in_parts = sum(row["steps"] for row in by_kind.values())
    applying = sum(row["seconds"] for row in by_kind.values())
    planned = figures["next_part"]
    print(f"{figures['policy']}: {figures['events']} events, {figures['steps']} steps, {parts} parts "
          f"({steps_in_parts} steps in parts), {decoders / max(parts, 1):.1f} decoders and "
          f"{steps_in_parts / max(parts, 1):.1f} steps a part; applying {applying * 1e3:.0f} ms; "
          f"parts planned after another: {planned['parts']} of {planned['plans']} tried "
          f"({planned['seconds'] * 1e3:.0f} ms)")
    print(f"  {'kind':<10} {'parts':>7} {'share':>6} {'decoders':>9} {'steps':>6} {'apply ms':>9} {'us/part':>8}")
    rows = sorted(by_kind.items(), key=lambda item: -item[1]["parts"])
    for kind, row in rows[:top]:
        count = row["parts"]
        print(f"  {kind:<10} {count:>7} {count / parts:>6.1%} {row['decoders'] / count:>9.1f} "
              f"{row['steps'] / count:>6.1f} {row['seconds'] * 1e3:>9.1f} {row['seconds'] / count * 1e6:>8.1f}")
    if len(rows) > top:
        rest = sum(row["parts"] for _, row in rows[top:])
        print(f"  ({len(rows) - top} more kinds: {rest} parts)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--policies", nargs="+", default=REFERENCE_POLICIES, choices=REFERENCE_POLICIES)
    parser.add_argument("--top", type=int, default=12, help="kinds listed (the most frequent)")
    args = parser.parse_args(argv)
    compile_packages(ROOT)
    for policy in args.policies:
        report(survey(args.size, policy), args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
