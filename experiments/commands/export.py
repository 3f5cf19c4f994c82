"""`servesim export --vllm DIR [--out PATH]`: results as vLLM `bench serve` result JSON, one file per policy.

Set SOURCE_DATE_EPOCH to pin the `date` field (byte-identical files from identical results).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, help="a results folder written by `servesim run` or `servesim sweep`")
    parser.add_argument("--vllm", action="store_true", required=True,
                        help="write vLLM `bench serve --save-result --save-detailed` JSON (the only format so far)")
    parser.add_argument("--out", type=Path, default=None,
                        help="a .json file when exactly one policy is exported, else a folder "
                             "(default: DIR/vllm/<label>.json, or DIR/vllm/<point_id>/<label>.json for a sweep)")
    parser.add_argument("--policy", action="append", default=[], metavar="LABEL",
                        help="export only this policy label (repeatable)")


def run(args: argparse.Namespace) -> int:
    from experiments.io import atomic_write_text, path_under
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
    single_file = args.out is not None and args.out.suffix == ".json"
    if single_file and len(rows) != 1:
        raise ConfigError(f"--out names one file but {len(rows)} policies would be exported; "
                          "give a folder or pick one with --policy", where="--out")
    folder = args.out if args.out is not None and not single_file else results.root / "vllm"
    date = result_date()
    for row in rows:
        policy_folder = results.policy_folder(row)
        data = to_vllm(row, read_policy_table(policy_folder, "requests"), read_policy_table(policy_folder, "steps"),
                       read_resolved(policy_folder.parent), date=date)
        sub = str(row["point_id"]) if row.get("point_id") else ""
        # Labels and point ids are read from the results folder: path_under keeps even a
        # hand-edited one from placing a file outside the export folder.
        path = args.out if single_file else path_under(folder, sub, f"{row['label']}.json")
        # Compact, as vLLM writes it: the per-request lists would otherwise take a line per number.
        atomic_write_text(path, json.dumps(data) + "\n")
        print(path)
    return 0
