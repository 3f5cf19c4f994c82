"""Running a sweep plan into a folder: skip finished points, run the rest, rebuild the dataset."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from experiments.io import (
    check_replaceable,
    fresh_staging,
    is_empty_folder,
    locked_folder,
    replace_folder,
    resumed_staging,
    scratch_dir,
)
from experiments.sweep import SweepPlan, SweepPoint
from experiments.sweep_exec import PointTask, make_executor
from experiments.sweep_store import SweepStore


@dataclass
class SweepOutcome:
    store: SweepStore
    num_points: int
    # Points already finished before this run (resumed), and run now.
    skipped: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    # point_id -> error message, for points that failed in this run.
    failed: dict[str, str] = field(default_factory=dict)
    dataset: Path | None = None


def run_sweep(
    plan: SweepPlan,
    out: Path,
    *,
    jobs: int = 1,
    executor: str = "local",
    address: str | None = None,
    progress: bool = True,
    overwrite: bool = False,
) -> SweepOutcome:
    """Run every unfinished point of `plan` into `out`; the dataset is rebuilt even if interrupted.
    The folder is held for this process meanwhile (experiments.io.locked_folder).

    A folder of the same plan is resumed in place, and an empty one filled in place (a reader
    sees the finished points, and the report says which are not run yet). A folder holding
    other results is replaced whole, and only with `overwrite`: the new sweep is built beside
    it (where an interrupted one resumes) and swapped into place once every point has run, so
    until then the folder keeps the previous sweep."""
    with locked_folder(out):
        if SweepStore(out).holds_plan(plan) or is_empty_folder(out):
            return _run_locked(plan, out, jobs=jobs, executor=executor, address=address, progress=progress)
        check_replaceable(out, overwrite=overwrite, what="sweep")
        staged = resumed_staging(out)
        if not SweepStore(staged).holds_plan(plan):
            staged = fresh_staging(out)
        outcome = _run_locked(plan, staged, jobs=jobs, executor=executor, address=address, progress=progress,
                              scratch=scratch_dir(out))
        replace_folder(staged, out)
        outcome.store = SweepStore(out)
        outcome.dataset = out / outcome.dataset.name
        return outcome


def _run_locked(plan: SweepPlan, out: Path, *, jobs: int, executor: str, address: str | None,
                progress: bool, scratch: Path | None = None) -> SweepOutcome:
    store = SweepStore(out)
    store.write_manifest(plan)
    outcome = SweepOutcome(store, len(plan.points))
    todo: list[SweepPoint] = []
    for point in plan.points:
        (outcome.skipped if store.is_done(point.point_id) else todo).append(point)
    by_id = {p.point_id: p for p in todo}
    bar = _progress_bar(len(plan.points), len(outcome.skipped), enabled=progress)
    try:
        tasks = [PointTask(p.point_id, p.data, _abs(plan.source)) for p in todo]
        # A single point needs no pool (or Ray start-up); it runs inline.
        jobs = min(jobs, len(tasks)) if executor == "local" else jobs
        with make_executor(executor, jobs=jobs, address=address,
                           scratch=scratch or scratch_dir(out)) as pool:
            for output in pool.run(tasks):
                point = by_id[output.point_id]
                store.record(point, output)
                if output.error is None:
                    outcome.ran.append(point.point_id)
                else:
                    outcome.failed[point.point_id] = output.error
                    bar.write(f"servesim: point {point.point_id} ({point.title}) failed: "
                              f"{output.error.strip().splitlines()[-1]}", file=sys.stderr)
                bar.set_postfix_str(point.title[:60], refresh=False)
                bar.update(1)
    finally:
        bar.close()
        outcome.dataset = store.build_dataset(plan)
    return outcome


def _abs(source: str | None) -> str | None:
    # Workers may start in another directory (Ray), so hand them an absolute path.
    return str(Path(source).resolve()) if source is not None else None


def _progress_bar(total: int, initial: int, *, enabled: bool):  # noqa: ANN202 - tqdm.tqdm
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="point", desc="sweep", file=sys.stderr, disable=not enabled,
                dynamic_ncols=True, smoothing=0.1)
