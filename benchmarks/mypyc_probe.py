"""What compiling some of the simulator's modules with mypyc would gain, measured (issue: 10k requests
in about a second).

The 10k reference runs spend their time in some 40 Python functions, none above a tenth of the loop,
about 100 Python-level calls a part of a run (`run_parts.py`); of late, a session of cheaper passes
saves 2 to 4%. A compiler that turns typed Python into C extensions (mypyc, part of mypy) removes
the interpreter's overhead from the modules it compiles, with the same source. This script measures
that on a copy of the tree, without touching the tree or the install:

    pip install mypy                          # mypyc comes with it (a C compiler is needed too)
    python benchmarks/mypyc_probe.py          # the default modules, both reference policies, 3 runs each
    python benchmarks/mypyc_probe.py --modules policies/stretch.py --repeat 5
    python benchmarks/mypyc_probe.py --keep /tmp/native   # keep the compiled copy (tree/) and the outputs (out/)

It copies the packages into a temporary folder, compiles the given modules there (each becomes an
extension module beside its source, which Python imports first), and runs the 10k reference case
(`sim_speed.experiment`) in both trees by turns, each run in its own process, outputs written. It
reports the best and median wall times and the best simulation-loop time of each, checks that both
trees write the same request, step and summary files, and that the compiled tree's run really
imported every compiled module. On a shared machine the wall times move by more than a few modules
save: count instructions instead (`--keep FOLDER`, then `sim_instructions.py --trees . FOLDER/tree`).

The default modules are those that mypyc compiles as they are (they type-check, and use nothing it
does not support), and the reference cases run alike with them. They are not all a build could
ship: a compiled class refuses interpreted subclasses, and `BlockManager` (block ids, the prefix
cache) subclasses `decode_blocks.BlockArithmetic`, so 150 tests fail with it compiled. Without the
two block modules every test passes but one (it wraps a method of `Stretch`, which a compiled
class does not allow), and the saving is within the noise. The rest of the hot path
does not compile as it stands: the policies are a class with three mix-ins (mypyc's native classes
take one base class; mix-ins must be traits), the engine's loop is a set of closures over untyped
state, the roofline model sets undeclared attributes on a frozen dataclass, and `Request.copy`
builds instances with `object.__new__`. What was measured, and what compiling the policies took,
is in benchmarks/README.md ("Twenty-fourth session").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The packages a run imports, and the benchmarks (the case runs the copy's own sim_speed).
COPIED = ("simcore", "policies", "backends", "workloads", "experiments", "benchmarks")
DEFAULT_MODULES = ["policies/stretch.py", "simcore/block_counter.py", "simcore/decode_blocks.py",
                   "simcore/itl.py", "simcore/plan.py"]
REFERENCE_POLICIES = ["continuous", "chunked_prefill"]


def run_case(tree: Path, out: Path, size: int, policy: str, modules: list[str]) -> dict:
    """One reference case from the tree at `tree` (its own `sim_speed.run_case`), outputs written
    to `out`: its times, and how many of `modules` were imported compiled."""
    sys.path.insert(0, str(tree / "benchmarks"))
    import sim_speed

    figures = sim_speed.run_case(size, policy, out)
    names = [module.removesuffix(".py").replace("/", ".") for module in modules]
    compiled = sum(not sys.modules[name].__file__.endswith(".py") for name in names if name in sys.modules)
    return {"wall_s": figures["wall_s"], "loop_s": figures["simulate_s"], "compiled": compiled}


def same_outputs(first: Path, second: Path) -> list[str]:
    """The output files that differ between two runs' folders (Parquet files by their tables)."""
    import pyarrow.parquet as pq

    differ = []
    names = sorted({path.relative_to(first) for path in first.rglob("*") if path.is_file()} |
                   {path.relative_to(second) for path in second.rglob("*") if path.is_file()})
    for name in names:
        a, b = first / name, second / name
        if not (a.is_file() and b.is_file()):
            differ.append(str(name))
        elif name.suffix == ".parquet":
            if not pq.read_table(a).equals(pq.read_table(b)):
                differ.append(str(name))
        elif a.read_bytes() != b.read_bytes():
            differ.append(str(name))
    return differ


def compile_copy(modules: list[str], work: Path) -> Path:
    """A copy of the tree's packages under `work` with `modules` compiled in place."""
    tree = work / "tree"
    for package in COPIED:
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    command = [sys.executable, "-m", "mypyc", "--ignore-missing-imports", "--follow-imports=silent", *modules]
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mypyc_probe.py: mypyc could not compile {' '.join(modules)} "
                         f"(exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modules", nargs="+", default=DEFAULT_MODULES,
                        help="modules to compile, as paths from the tree's root")
    parser.add_argument("--policies", nargs="+", default=REFERENCE_POLICIES, choices=REFERENCE_POLICIES)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case in each tree")
    parser.add_argument("--keep", type=Path, help="build the compiled copy in this new folder and keep it (say, to "
                        "count its instructions: sim_instructions.py --trees . FOLDER/tree)")
    parser.add_argument("--case", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        tree, out, size, policy, modules = args.case
        print(json.dumps(run_case(Path(tree), Path(out), int(size), policy, json.loads(modules))))
        return 0
    for module in args.modules:
        path = ROOT / module
        if not (module.endswith(".py") and path.is_file() and path.resolve().is_relative_to(ROOT)
                and Path(module).parts[0] in COPIED):
            print(f"mypyc_probe.py: --modules {module}: expected a .py file of the tree's packages "
                  f"({', '.join(COPIED)}), as a path from {ROOT}", file=sys.stderr)
            return 2
    if args.repeat < 1:
        print(f"mypyc_probe.py: --repeat must be at least 1, got {args.repeat}", file=sys.stderr)
        return 2
    if args.keep is not None and args.keep.exists():
        print(f"mypyc_probe.py: --keep {args.keep}: already exists (expected a new folder)", file=sys.stderr)
        return 2
    if importlib.util.find_spec("mypyc") is None:
        print("mypyc_probe.py: needs mypyc, which comes with mypy: pip install mypy (and a C compiler)",
              file=sys.stderr)
        return 2
    from sim_speed import compile_packages

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) if args.keep is None else args.keep.resolve()
        started = time.perf_counter()
        compiled_tree = compile_copy(args.modules, work)
        print(f"compiled {len(args.modules)} modules in {time.perf_counter() - started:.0f} s: "
              f"{' '.join(args.modules)}")
        print(f"requests: {args.size}  python: {sys.version.split()[0]}  runs per case: {args.repeat}")
        print(f"{'policy':<16} {'tree':<9} {'wall s':>7} {'median s':>9} {'loop s':>7} {'loop vs python':>15}  outputs")
        trees = {"python": ROOT, "compiled": compiled_tree}
        for tree in trees.values():
            compile_packages(tree)
        for policy in args.policies:
            runs: dict[str, list[dict]] = {name: [] for name in trees}
            for repeat in range(args.repeat):
                for name, tree in trees.items():
                    out = work / "out" / f"{policy}-{name}-{repeat}"
                    done = subprocess.run([sys.executable, __file__, "--case", str(tree), str(out), str(args.size),
                                           policy, json.dumps(args.modules)], capture_output=True, text=True)
                    if done.returncode != 0:
                        raise SystemExit(f"mypyc_probe.py: the {name} tree's {policy} case failed:\n"
                                         f"{done.stderr[-3000:]}")
                    runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            differ = same_outputs(work / "out" / f"{policy}-python-0", work / "out" / f"{policy}-compiled-0")
            loaded = min(run["compiled"] for run in runs["compiled"])
            if loaded != len(args.modules):
                raise SystemExit(f"mypyc_probe.py: the compiled tree imported {loaded} of {len(args.modules)} "
                                 "modules compiled")
            best_python_loop = min(run["loop_s"] for run in runs["python"])
            for name in trees:
                walls = [run["wall_s"] for run in runs[name]]
                loop = min(run["loop_s"] for run in runs[name])
                outputs = "identical" if not differ else "DIFFER: " + ", ".join(differ)
                print(f"{policy:<16} {name:<9} {min(walls):>7.2f} {statistics.median(walls):>9.2f} {loop:>7.2f} "
                      f"{100 * (loop / best_python_loop - 1):>+14.1f}%  {outputs if name == 'compiled' else ''}",
                      flush=True)
            if differ:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
