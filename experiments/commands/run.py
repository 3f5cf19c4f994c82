"""`servesim run FILE.yaml`: simulate every policy of an experiment and write a results folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.commands.arg_types import add_no_fast_forward, fast_forward_overrides
from experiments.table import TABLE_STYLES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", type=Path, help="experiment YAML file")
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default: results/<experiment name>)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results folder whole if it already holds results")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field, e.g. --set workload.num_requests=50 (repeatable)")
    parser.add_argument("--check", action="store_true", help="verify block-manager invariants after every step")
    parser.add_argument("--quiet", action="store_true", help="print only the summary table (no progress)")
    parser.add_argument("--table", choices=TABLE_STYLES, default="text",
                        help="print the summary table as aligned text, CSV or Markdown")
    add_no_fast_forward(parser)


def run(args: argparse.Namespace) -> int:
    from experiments.config import load_experiment
    from experiments.io import check_replaceable, fresh_staging, locked_folder, remove_staging, replace_folder
    from experiments.progress import RunProgress, progress_wanted
    from experiments.runner import run_experiment
    from experiments.table import format_summary_table
    from simcore.errors import ConfigError

    overrides = list(args.overrides)
    if args.check:
        overrides.append("limits.check_invariants=true")
    overrides += fast_forward_overrides(args)
    exp = load_experiment(args.experiment, overrides)
    out = args.out or Path("results") / exp.name
    created = _folders_to_create(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the results folder ({exc.strerror})", where="--out", found=str(out)) from None
    echo = None if args.quiet else (lambda line: print(line, file=sys.stderr))
    if echo:
        echo(f"servesim: {exp.name}: {len(exp.policies)} policies -> {out}")
    try:
        with locked_folder(out):
            check_replaceable(out, overwrite=args.overwrite)
            # Built beside --out and swapped into place when complete: the folder holds the
            # previous results or the new ones, never a mix, whenever the run is killed.
            staged = fresh_staging(out)
            try:
                result = run_experiment(exp, source=args.experiment, out_dir=staged, echo=echo,
                                        progress=RunProgress(progress_wanted(args.quiet)))
            except BaseException:
                remove_staging(out)
                raise
            replace_folder(staged, out)
    except BaseException:
        # A run that fails leaves no empty folder of its own behind.
        _remove_empty(created)
        raise
    if echo is None:
        for note in result.info.get("workload_notes", []):
            print(f"note: workload: {note}", file=sys.stderr)
    print(format_summary_table([r.summary for r in result.runs], args.table))
    for r in result.runs:
        if r.result.end_reason != "done":
            print(f"note: {r.label} stopped at {r.result.end_reason} with "
                  f"{len(r.result.unfinished)} requests unfinished", file=sys.stderr)
        if r.result.rejected:
            print(f"note: {r.label} rejected {len(r.result.rejected)} requests "
                  f"(first reason: {r.result.rejected[0].reject_reason})", file=sys.stderr)
    print(f"results: {out}")
    return 0


def _folders_to_create(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first."""
    missing = []
    for path in (folder, *folder.parents):
        if path.exists():
            break
        missing.append(path)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first: a parent is empty only once its child is gone
        try:
            folder.rmdir()
        except OSError:
            return  # not empty (or already gone): it and its parents stay
