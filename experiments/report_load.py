"""Reading a results folder back: a `run` folder or a `sweep` folder, as one table of summaries.

Both kinds become `Results`: one summary row per (point, policy label), with the swept values as
columns (a run folder is a sweep of one point with no swept keys), plus where each row's
per-request and per-step tables live.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.io import FORMAT_VERSION, LOCK_FILE, read_table
from simcore.errors import ConfigError
from simcore.validate import MAX_YAML_CHARS, load_yaml_text

# What a started `servesim run` or `capacity` leaves in a folder before its last file.
INCOMPLETE_SIGNS = ("resolved.yaml", "run_info.json", "points", LOCK_FILE)


@dataclass
class Results:
    kind: str  # "run" or "sweep"
    root: Path
    # One row per (point, policy label): point_index, point_id, variant, swept keys, then summary keys.
    summaries: pd.DataFrame
    keys: list[str] = field(default_factory=list)
    variants: list[str] = field(default_factory=list)
    name: str = "experiment"

    def run_folder(self, point_id: str | None) -> Path:
        """The folder `servesim run` would have written for this point."""
        return self.root if point_id is None else self.root / "points" / point_id

    def policy_folder(self, row: pd.Series | dict) -> Path:
        return self.run_folder(row.get("point_id")) / str(row["label"])

    def first_run_folder(self) -> Path:
        if self.kind == "run" or self.summaries.empty:
            return self.run_folder(None) if self.kind == "run" else self.root
        return self.run_folder(str(self.summaries.iloc[0]["point_id"]))

    def series_name(self, row: pd.Series | dict, *, with_keys: list[str] | tuple[str, ...] = ()) -> str:
        """A legend entry: policy label, then variant and the given swept values when they vary."""
        parts = [str(row["label"])]
        if self.variants:
            parts.append(str(row["variant"]))
        parts += [f"{short_key(k, self.keys)}={row[k]}" for k in with_keys]
        return " / ".join(parts)


def load_results(path: str | Path) -> Results:
    root = Path(path)
    if (root / "sweep.json").is_file():
        return _load_sweep(root)
    summary = root / "summary.json"
    if summary.is_file():
        data = json.loads(summary.read_text())
        if isinstance(data, dict):
            raise ConfigError("this is one policy's folder; give its parent (the results folder)", source=str(root))
        check_format(root, read_run_info(root), "run_info.json")
        frame = pd.DataFrame(data)
        frame.insert(0, "point_index", 0)
        frame.insert(1, "point_id", None)
        frame.insert(2, "variant", None)
        resolved = read_resolved(root)
        return Results("run", root, frame, name=str(resolved.get("name", root.name)))
    if not root.exists():
        raise ConfigError("results folder not found", source=str(root))
    if any((root / name).exists() for name in INCOMPLETE_SIGNS) or _has_policy_folder(root):
        # summary.json, sweep.json and capacity.json are each written after the files they describe.
        raise ConfigError("incomplete results: a run into this folder has not finished (or was killed); "
                          "run it again to complete the folder", source=str(root))
    raise ConfigError("not a results folder: expected summary.json (servesim run) or sweep.json (servesim sweep)",
                      source=str(root))


def _has_policy_folder(root: Path) -> bool:
    """A policy's folder (DIR/<label>/summary.json), as a run writes before its own summary.json."""
    try:
        return any((p / "summary.json").is_file() for p in root.iterdir() if p.is_dir())
    except OSError:
        return False


def _load_sweep(root: Path) -> Results:
    manifest = json.loads((root / "sweep.json").read_text())
    check_format(root, manifest, "sweep.json")
    dataset = root / "sweep.parquet"
    if not dataset.is_file():
        raise ConfigError("sweep.parquet is missing; re-run `servesim sweep` to rebuild it", source=str(root))
    frame = pd.read_parquet(dataset)
    return Results("sweep", root, frame, keys=list(manifest["keys"]), variants=list(manifest["variants"]),
                   name=str(manifest.get("name", root.name)))


def check_format(root: Path, record: dict[str, Any], name: str) -> None:
    """Refuse a folder written in another layout than this servesim reads (FORMAT_VERSION in
    run_info.json, sweep.json): an older one may mix runs, a newer one may mean other things."""
    found = record.get("format_version")
    if found == FORMAT_VERSION:
        return
    if found is None or (isinstance(found, int) and found < FORMAT_VERSION):
        why = "it was written by an older servesim, whose folders could mix the files of two runs"
    else:
        why = "it was written by a newer servesim"
    raise ConfigError(f"results folder of another format: {why}; run the experiment again to rewrite it",
                      source=str(root), where=f"{name}: format_version", expected=str(FORMAT_VERSION),
                      found=found)


def read_resolved(run_folder: Path) -> dict[str, Any]:
    path = run_folder / "resolved.yaml"
    # Written by servesim from an input of at most MAX_YAML_CHARS, but one list item a line.
    return load_yaml_text(path.read_text(), max_chars=16 * MAX_YAML_CHARS) if path.is_file() else {}


def read_run_info(run_folder: Path) -> dict[str, Any]:
    path = run_folder / "run_info.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def read_policy_table(policy_folder: Path, name: str) -> pd.DataFrame:
    """requests or steps of one policy, whichever format the run wrote."""
    for suffix in (".parquet", ".csv"):
        path = policy_folder / f"{name}{suffix}"
        if path.is_file():
            return read_table(path)
    raise ConfigError(f"{name} table not found (expected {name}.parquet or {name}.csv)", source=str(policy_folder))


def short_key(key: str, keys: list[str]) -> str:
    """The last segment of a swept path (`rate`), or the whole path when that would be ambiguous."""
    last = key.rsplit(".", 1)[-1]
    return last if sum(k.rsplit(".", 1)[-1] == last for k in keys) == 1 else key
