"""What `limits.check_invariants` (`servesim run --check`) costs on the quickstart experiment.

Four configurations run side by side in one process, interleaved, several repetitions each; the
median wall time of each is printed with the ratios:

  plain             check_invariants off (the default; runs of steps are fast-forwarded)
  checked           check_invariants on (checked after every step and every fast-forwarded run)
  stepwise          check_invariants off, fast-forward off (every step taken one at a time)
  stepwise-checked  check_invariants on, fast-forward off (the checker after every single step)

checked / plain is what a user pays for --check; stepwise-checked / stepwise is the checker's
cost when it runs after every step.

    PYTHONPATH=. python benchmarks/invariant_cost.py [--reps 5] [--set workload.num_requests=100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments import runner  # noqa: E402
from experiments.config import load_experiment  # noqa: E402

QUICKSTART = ROOT / "experiments" / "examples" / "quickstart.yaml"
CONFIGS = ("plain", "checked", "stepwise", "stepwise-checked")


def run_once(path: Path, overrides: list[str], config: str) -> tuple[float, dict[str, float]]:
    """Wall seconds of one whole experiment run, and the simulate() time of each policy."""
    checked = "true" if config.endswith("checked") else "false"
    fast_forward = "false" if config.startswith("stepwise") else "true"
    exp = load_experiment(path, [*overrides, f"limits.check_invariants={checked}",
                                 f"limits.fast_forward={fast_forward}", "output.plots=false"])
    started = time.perf_counter()
    run = runner.run_experiment(exp, source=path, out_dir=None)
    wall = time.perf_counter() - started
    return wall, {r.label: r.result.wall_time_s for r in run.runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", type=Path, default=QUICKSTART)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    run_once(args.experiment, args.overrides, "plain")  # warm-up: imports, caches
    walls: dict[str, list[float]] = {c: [] for c in CONFIGS}
    sims: dict[str, dict[str, list[float]]] = {c: {} for c in CONFIGS}
    for rep in range(args.reps):
        order = CONFIGS if rep % 2 == 0 else tuple(reversed(CONFIGS))
        for config in order:
            wall, per_policy = run_once(args.experiment, args.overrides, config)
            walls[config].append(wall)
            for label, seconds in per_policy.items():
                sims[config].setdefault(label, []).append(seconds)

    median = {c: statistics.median(walls[c]) for c in CONFIGS}
    print(f"{args.experiment.name} {' '.join(args.overrides)}: median of {args.reps} runs, wall seconds")
    print(f"{'config':<17} {'run':>8}  " + "  ".join(f"{label:>16}" for label in sims["plain"]))
    for config in CONFIGS:
        cells = "  ".join(f"{statistics.median(v):>16.3f}" for v in sims[config].values())
        print(f"{config:<17} {median[config]:>8.3f}  {cells}")
    print(f"checked / plain    = {median['checked'] / median['plain']:.2f}x  (cost of --check to a user)")
    print(f"stepwise-checked / stepwise = {median['stepwise-checked'] / median['stepwise']:.2f}x  "
          "(the checker after every step)")
    for label in sims["plain"]:
        ratio = statistics.median(sims["checked"][label]) / statistics.median(sims["plain"][label])
        print(f"  {label}: simulate() checked / plain = {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
