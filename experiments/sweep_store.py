"""A sweep's folder on disk: one results folder per point, a DONE marker, and the combined dataset.

    DIR/sweep.json                 the plan: axes, variants, point ids and their values
    DIR/points/<point_id>/         the point's own results folder (as `servesim run` writes it)
    DIR/points/<point_id>/DONE.json   written atomically last; holds the summaries
    DIR/points/<point_id>/ERROR.json  instead of DONE.json when the point failed
    DIR/sweep.parquet              one row per (point, policy label), rebuilt from the DONE files

A point is finished iff its DONE.json exists. Every file is written atomically and DONE.json
last, so an interrupted sweep (Ctrl-C, SIGKILL, power loss) loses at most the points in flight.
sweep.parquet always belongs to the sweep.json beside it: a sweep with a different plan removes
the old dataset before it writes its manifest, so a killed one leaves no dataset rather than
another plan's (readers then say to re-run the sweep).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.io import FORMAT_VERSION, atomic_write_bytes, path_under, scratch_dir, write_json, write_table
from experiments.sweep import SweepPlan, SweepPoint

DONE = "DONE.json"
ERROR = "ERROR.json"
MANIFEST = "sweep.json"
DATASET = "sweep.parquet"
# Columns that lead every dataset row, before the swept keys and the summary metrics.
ID_COLUMNS = ("point_index", "point_id", "variant")


@dataclass
class PointOutput:
    """What a worker hands back: the point's results folder as bytes, or the error that stopped it."""

    point_id: str
    files: dict[str, bytes]
    summaries: list[dict[str, Any]]
    error: str | None = None


class SweepStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.points_dir = self.root / "points"

    def point_dir(self, point_id: str) -> Path:
        return path_under(self.points_dir, point_id)

    def is_done(self, point_id: str) -> bool:
        return (self.point_dir(point_id) / DONE).is_file()

    def read_done(self, point_id: str) -> dict[str, Any]:
        return json.loads((self.point_dir(point_id) / DONE).read_text())

    def read_error(self, point_id: str) -> str | None:
        path = self.point_dir(point_id) / ERROR
        return json.loads(path.read_text())["error"] if path.is_file() else None

    def write_manifest(self, plan: SweepPlan) -> None:
        if not self.holds_plan(plan):
            path_under(self.root, DATASET).unlink(missing_ok=True)
        write_json(path_under(self.root, MANIFEST), {**plan.manifest(), "format_version": FORMAT_VERSION})

    def holds_plan(self, plan: SweepPlan) -> bool:
        """The folder's sweep.json is this plan's, in this layout version (so it can be resumed)."""
        return self.read_manifest() == {**plan.manifest(), "format_version": FORMAT_VERSION}

    def read_manifest(self) -> dict[str, Any] | None:
        """The sweep.json in the folder, or None when there is none (or it is unreadable)."""
        try:
            return json.loads((self.root / MANIFEST).read_text())
        except (OSError, ValueError):
            return None

    def record(self, point: SweepPoint, output: PointOutput) -> None:
        """Store a finished (or failed) point: results files first, DONE.json (or ERROR.json) last."""
        folder = self.point_dir(point.point_id)
        if folder.exists():
            # Leftovers of an interrupted or failed attempt: start clean so no stale file survives.
            shutil.rmtree(folder)
        if output.error is not None:
            write_json(path_under(folder, ERROR), {**_identity(point), "error": output.error})
            return
        for rel, data in sorted(output.files.items()):
            atomic_write_bytes(path_under(folder, rel), data)
        write_json(path_under(folder, DONE), {**_identity(point), "summaries": output.summaries})

    def adopt_points(self, other: SweepStore) -> None:
        """Take the finished points of `other` that this store lacks, as hard links (a copy where
        the file system has none): their files are only ever replaced, never changed in place.
        Each is linked into the scratch folder first and renamed into points/ whole, so a kill
        leaves no point folder with DONE.json but without its tables."""
        if not other.points_dir.is_dir():
            return
        for source in sorted(other.points_dir.iterdir()):
            if not (source / DONE).is_file() or self.is_done(source.name):
                continue
            target = self.point_dir(source.name)
            partial = path_under(scratch_dir(self.root), "adopt", source.name)
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(source, partial, copy_function=_link_or_copy, symlinks=True)
            shutil.rmtree(target, ignore_errors=True)  # an unfinished attempt's leftovers
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(partial, target)

    def stale_folders(self, plan: SweepPlan) -> list[str]:
        """Point folders that belong to no point of this plan (an earlier, different sweep)."""
        if not self.points_dir.is_dir():
            return []
        known = {p.point_id for p in plan.points}
        return sorted(p.name for p in self.points_dir.iterdir() if p.is_dir() and p.name not in known)

    def build_dataset(self, plan: SweepPlan) -> Path:
        """sweep.parquet from the DONE files of this plan's finished points, in point order."""
        return write_table(dataset_frame(plan, self), path_under(self.root, DATASET), "parquet")


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _identity(point: SweepPoint) -> dict[str, Any]:
    return {"index": point.index, "point_id": point.point_id, "variant": point.variant, "values": point.values}


def dataset_frame(plan: SweepPlan, store: SweepStore) -> pd.DataFrame:
    columns = [*ID_COLUMNS, *plan.keys]
    rows: list[dict[str, Any]] = []
    for point in plan.points:
        if not store.is_done(point.point_id):
            continue
        done = store.read_done(point.point_id)
        config = {"point_index": point.index, "point_id": point.point_id, "variant": point.variant}
        config.update({key: _cell(point.values[key]) for key in plan.keys})
        for summary in done["summaries"]:
            row = dict(config)
            for key, value in summary.items():
                if key not in row:
                    row[key] = _cell(value)  # (a cluster's per-replica lists as JSON text)
                    if key not in columns:
                        columns.append(key)
            rows.append(row)
    frame = pd.DataFrame(rows, columns=columns)
    for key in plan.keys:
        kinds = {type(v) for v in frame[key] if v is not None}
        if len(kinds) > 1 and not kinds <= {int, float}:
            # Parquet columns need one type: a key swept over mixed kinds (64 and "auto") becomes text.
            frame[key] = [None if v is None else json.dumps(v) for v in frame[key]]
    return frame


def _cell(value: Any) -> Any:
    # Parquet columns need one type; a mapping or list (a whole arrival spec, a cluster's
    # per-replica figures) goes in as JSON.
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value
