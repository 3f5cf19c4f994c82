"""Instructions the reference runs execute, counted by valgrind: a measure of the simulator's work
that a shared machine's noise does not move (issue: 10k requests in about a second).

Wall time on these 2-core machines swings by 15% or more between runs minutes apart, more than
most changes gain. The instructions a run executes, counted by valgrind's cachegrind, repeat to
within about 0.5% (PYTHONHASHSEED is fixed; allocation addresses still vary), so two trees can be
compared one run each, and the cost of a part of the work can be read off by running without it.
Each case runs `sim_speed.experiment` (the 10k reference workload by default) in its own process,
outputs written, as `sim_speed.py --case` does; `setup` is the same process stopped once the
experiment is built, so `run` (the total less setup, measured once, with the first tree) is
what simulating and writing cost; every tree's packages are compiled (as `sim_speed.py` does) first.

    python benchmarks/sim_instructions.py                            # this tree, both policies
    python benchmarks/sim_instructions.py --trees . /tmp/base        # side by side (a worktree)
    python benchmarks/sim_instructions.py --without step_log itl     # each part's cost, by its absence

`--without` runs the simulation with a part of its bookkeeping switched off (the results' other
outputs are unchanged; the part's own are empty): `step_log`, the step records (building,
deriving their counts, writing); `itl`, the inter-token gaps. Needs valgrind on the PATH; about
50x slower than the run itself (a minute for a 10k case).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("step_log", "itl")


def run_case(root: Path, size: int, policy: str, without: str | None, setup_only: bool) -> dict | None:
    """One case in this process, from the tree at `root` (its simulator and its sim_speed): what
    it kept, to check that a part switched off was (None for setup only)."""
    sys.path[:0] = [str(root), str(root / "benchmarks")]
    import sim_speed

    from experiments.config import parse_experiment
    from experiments.runner import run_experiment

    exp = parse_experiment(sim_speed.experiment(size, policy), source=None)
    if setup_only:
        return
    if without is not None:
        _switch_off(without)
    with tempfile.TemporaryDirectory() as tmp:
        (only,) = run_experiment(exp, source=None, out_dir=Path(tmp)).runs
    steps = only.result.steps
    return {"completed": only.summary["completed"], "p50_ttft_ms": only.summary["p50_ttft_ms"],
            "steps_written": steps.spilled or bool(steps.chunks), "itl_samples": only.result.itl.num_samples}


def _switch_off(part: str) -> None:
    """Make `part`'s bookkeeping do nothing (for the run in this process only)."""
    if part == "step_log":
        from policies.fast_path import StretchMixin
        from simcore.steplog import StepLog

        class _Counts:  # what the engine sets on a run's counts
            last = None

        def append(self, values, extras=None) -> None:  # noqa: ANN001
            self.num_rows += 1

        def add_run(self, num_steps, columns, derived=None) -> None:  # noqa: ANN001
            self.num_rows += num_steps

        StepLog.append, StepLog.add_run = append, add_run
        StretchMixin.stretch_run_counts = lambda self, stretch, num_steps: _Counts()
        StretchMixin.joined_run_counts = lambda self, stretch, then, num_then: (_Counts(), _Counts())
    elif part == "itl":
        from simcore.itl import ItlLog

        for name in ("add", "add_two", "add_run", "add_weighted", "add_gaps"):
            setattr(ItlLog, name, lambda self, *args: None)
    else:
        raise ValueError(f"unknown part {part!r}; expected one of {', '.join(PARTS)}")


def count(root: Path, size: int, policy: str, without: str | None = None, setup_only: bool = False) -> int:
    """Instructions (cachegrind's I refs) of one case in a fresh process under valgrind."""
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
               sys.executable, __file__, "--case", str(root), str(size), policy, without or "-",
               "setup" if setup_only else "run"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"case {size} {policy} in {root} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", type=Path, nargs="+", default=[ROOT], help="source trees to compare")
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--policies", nargs="+", default=["continuous", "chunked_prefill"])
    parser.add_argument("--without", nargs="+", default=[], choices=PARTS, help="also run without each part")
    parser.add_argument("--case", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        root, size, policy, without, mode = args.case
        kept = run_case(Path(root), int(size), policy, None if without == "-" else without, mode == "setup")
        print(json.dumps(kept))
        return 0
    trees = [tree.resolve() for tree in args.trees]
    for tree in trees:
        if not (tree / "simcore" / "engine.py").is_file():
            print(f"sim_instructions.py: --trees {tree}: not a servesim source tree (no simcore/engine.py)",
                  file=sys.stderr)
            return 2
    if shutil.which("valgrind") is None:
        print("sim_instructions.py: valgrind is not on the PATH (it counts the instructions)", file=sys.stderr)
        return 2
    # Here, not at the top: a case imports the sim_speed of the tree it counts.
    from sim_speed import compile_packages

    for tree in trees:
        # Compiled first: where bytecode is not written (PYTHONDONTWRITEBYTECODE, set on these
        # machines) every case would compile the tree again, about 390M instructions; elsewhere
        # whichever case ran first would pay for it.
        compile_packages(tree)
    print(f"requests: {args.size}  python: {sys.version.split()[0]}  instructions in millions; run: total "
          "less the first tree's setup")
    print(f"{'tree':<28} {'policy':<16} {'case':<18} {'total':>9} {'run':>9} {'vs first':>9}")
    for policy in args.policies:
        setup = first_run = None
        for tree in trees:
            if setup is None:
                setup = count(tree, args.size, policy, setup_only=True)
            for without in [None, *args.without]:
                run = count(tree, args.size, policy, without) - setup
                first_run = first_run if first_run is not None else run
                case = "full" if without is None else f"without {without}"
                print(f"{str(tree)[-28:]:<28} {policy:<16} {case:<18} {(run + setup) / 1e6:>9.0f} {run / 1e6:>9.0f} "
                      f"{100 * (run / first_run - 1):>+8.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
