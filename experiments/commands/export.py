"""`servesim export --vllm DIR [--out PATH]`: results as vLLM `bench serve` result JSON, one file per policy.
`servesim export --tokens DIR [--out PATH]`: the tokens the engine recorded, as JSONL (experiments.token_export).

Set SOURCE_DATE_EPOCH to pin the `date` field (byte-identical files from identical results).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, help="a results folder written by `servesim run` or `servesim sweep`")
    formats = parser.add_mutually_exclusive_group(required=True)
    formats.add_argument("--vllm", action="store_true",
                         help="write vLLM `bench serve --save-result --save-detailed` JSON")
    formats.add_argument("--tokens", action="store_true",
                         help="write each request's prompt_token_ids and output_token_ids as JSONL (a run "
                              "with the torch cost model and record_tokens: true; default DIR/tokens/)")
    parser.add_argument("--out", type=Path, default=None,
                        help="a .json (.jsonl with --tokens) file when exactly one policy is exported, else a folder "
                             "(default: DIR/vllm/<label>.json, or DIR/vllm/<point_id>/<label>.json for a sweep)")
    parser.add_argument("--policy", action="append", default=[], metavar="LABEL",
                        help="export only this policy label (repeatable)")


def run(args: argparse.Namespace) -> int:
    from experiments.io import locked_folder

    if not args.results.is_dir() or not os.access(args.results, os.W_OK):
        return _export(args)  # load_results says what is wrong; a read-only folder cannot be held
    # Held throughout, so that a run replacing the folder meanwhile fails at once rather than
    # hand this export one run's summaries with another's tables.
    with locked_folder(args.results, where="DIR"):
        return _export(args)


def _export(args: argparse.Namespace) -> int:
    from experiments.io import atomic_write_text
    from experiments.report import clean_row
    from experiments.report_load import load_results, read_policy_table, read_resolved
    from experiments.vllm_interop import result_date, to_vllm
    from simcore.errors import ConfigError

    results = load_results(args.results)
    rows = [clean_row(r) for r in results.summaries.to_dict(orient="records")]
    if args.policy:
        known = sorted({r["label"] for r in rows})
        missing = [p for p in args.policy if p not in known]
        if missing:
            raise ConfigError("no such policy label", where="--policy", expected=f"one of {known}",
                              found=missing[0], choices=known)
        rows = [r for r in rows if r["label"] in args.policy]
    if args.tokens:
        from experiments.token_export import export_tokens

        for path in export_tokens(results, rows, args.out):
            print(path)
        return 0
    single_file = args.out is not None and args.out.suffix == ".json"
    if single_file and len(rows) != 1:
        raise ConfigError(f"--out names one file but {len(rows)} policies would be exported; "
                          "give a folder or pick one with --policy", where="--out")
    date = result_date()

    def vllm_text(row: dict) -> str:
        policy_folder = results.policy_folder(row)
        requests = read_policy_table(policy_folder, "requests")
        if len(requests) != row.get("num_requests", len(requests)):
            raise ConfigError(f"the summary counts {row['num_requests']} requests but the requests table has "
                              f"{len(requests)} rows: the folder mixes two runs; run the experiment again",
                              source=str(policy_folder))
        data = to_vllm(row, requests, read_policy_table(policy_folder, "steps"),
                       read_resolved(policy_folder.parent), date=date)
        # Compact, as vLLM writes it: the per-request lists would otherwise take a line per number.
        return json.dumps(data) + "\n"

    if single_file:
        atomic_write_text(args.out, vllm_text(rows[0]))
        print(args.out)
        return 0
    for path in _write_folder(args.out or results.root / "vllm", rows, vllm_text):
        print(path)
    return 0


def _write_folder(folder: Path, rows: list[dict], text_of) -> list[Path]:  # noqa: ANN001 - row -> str
    """One file per row, DIR/[<point_id>/]<label>.json, written beside `folder` and swapped in
    whole: a kill leaves the previous export or the new one, and no file of a policy or point
    the new export does not have."""
    from experiments.io import fresh_staging, locked_folder, path_under, remove_staging, replace_folder

    written = []
    with locked_folder(folder):
        _check_export_folder(folder)
        staged = fresh_staging(folder)
        try:
            for row in rows:
                sub = str(row["point_id"]) if row.get("point_id") else ""
                # Labels and point ids are read from the results folder: path_under keeps even a
                # hand-edited one from placing a file outside the export folder.
                path = path_under(staged, sub, f"{row['label']}.json")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text_of(row))
                written.append(folder / path.relative_to(staged))
        except BaseException:
            remove_staging(folder)
            raise
        replace_folder(staged, folder)
    return written


def _check_export_folder(folder: Path) -> None:
    """Only an empty folder or an earlier export (JSON files, in point folders for a sweep) is
    replaced: --out may name a folder of the user's own."""
    from experiments.io import LOCK_FILE, SCRATCH_DIR
    from simcore.errors import ConfigError

    for path in folder.rglob("*"):
        inside = path.relative_to(folder).parts
        if inside[0] in (LOCK_FILE, SCRATCH_DIR) or path.is_dir() and len(inside) == 1:
            continue
        if not (path.is_file() and path.suffix == ".json" and len(inside) <= 2):
            raise ConfigError("the folder holds other files than an export's; refusing to replace it "
                              "(give a new or empty folder)", where="--out", found=str(folder))
