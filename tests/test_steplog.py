"""Step records: single steps and runs (with their run-length forms) read back as the rows they stand for."""

from __future__ import annotations

import random

import numpy as np
import pytest

import simcore.steplog as steplog
from simcore.steplog import PER_STEP_COLUMNS, STEP_COLUMNS, StepLog


def _random_run(rng: random.Random, first_step: int, num_steps: int) -> tuple[tuple, list[tuple]]:
    """A run's columns in each form add_run takes, and the rows they stand for."""
    columns, expanded = [], []
    for name in STEP_COLUMNS:
        if name == "step_id":
            columns.append(range(first_step, first_step + num_steps))
            expanded.append(list(range(first_step, first_step + num_steps)))
            continue
        make = (lambda: rng.random()) if name in steplog.FLOAT_COLUMNS else (lambda: rng.randrange(1000))
        form = "list" if name in PER_STEP_COLUMNS else rng.choice(["one", "pair", "list"])
        if form == "one":
            value = make()
            columns.append(value)
            expanded.append([value] * num_steps)
        elif form == "pair":
            body, last = make(), make()
            columns.append((body, last))
            expanded.append([body] * (num_steps - 1) + [last])
        else:
            values = [make() for _ in range(num_steps)]
            columns.append(values)
            expanded.append(values)
    return tuple(columns), list(zip(*expanded))


@pytest.mark.parametrize("spill", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_rows_and_runs_read_back_in_order(seed, spill, tmp_path, monkeypatch):
    monkeypatch.setattr(steplog, "CHUNK_ROWS", 37)  # many chunks, sealed mid-way through runs and rows
    rng = random.Random(seed)
    log = StepLog(tmp_path / "steps.parquet" if spill else None)
    expected: list[tuple] = []
    while len(expected) < 400:
        if rng.random() < 0.5:
            row = (len(expected), rng.random(), rng.random(), *(rng.randrange(1000) for _ in STEP_COLUMNS[3:]))
            log.append(row)
            expected.append(row)
        else:
            columns, rows = _random_run(rng, len(expected), rng.randrange(2, 30))
            log.add_run(len(rows), columns)
            expected.extend(rows)
    log.close()
    assert len(log) == len(expected) and log.spilled == spill
    got = log.as_dict()
    for index, name in enumerate(STEP_COLUMNS):
        want = np.array([row[index] for row in expected])
        assert got[name].dtype == (np.float64 if name in steplog.FLOAT_COLUMNS else np.int64)
        np.testing.assert_array_equal(got[name], want, err_msg=name)


@pytest.mark.parametrize("spill", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_runs_with_derived_counts_read_back_in_order(seed, spill, tmp_path, monkeypatch):
    """Runs whose counts are derived when their chunk is sealed, among single rows and runs
    given whole, read back as the rows each stands for (whatever their derived columns held)."""
    from simcore.run_counts import RunCounts, expand_run_counts

    monkeypatch.setattr(steplog, "CHUNK_ROWS", 37)
    rng = random.Random(seed)
    log = StepLog(tmp_path / "steps.parquet" if spill else None)
    expected: list[tuple] = []
    while len(expected) < 400:
        kind = rng.random()
        if kind < 0.3:
            row = (len(expected), rng.random(), rng.random(), *(rng.randrange(1000) for _ in STEP_COLUMNS[3:]))
            log.append(row)
            expected.append(row)
            continue
        columns, rows = _random_run(rng, len(expected), rng.randrange(2, 30))
        if kind < 0.5:
            log.add_run(len(rows), columns)
            expected.extend(rows)
            continue
        firsts = [rng.randint(1, 12) for _ in range(rng.randrange(6))]
        run = RunCounts(len(rows), 4, 10, 50, 300, firsts, [], rng.choice([0, 3]), rng.randint(1, 9),
                        rng.random() < 0.5, rng.random() < 0.5, (rng.randrange(9), rng.randrange(99), rng.randrange(999)))
        derived = expand_run_counts([run])
        log.add_run(len(rows), columns, run)
        for index, row in enumerate(rows):
            values = list(row)
            for name, column in derived.items():
                values[STEP_COLUMNS.index(name)] = int(column[index])
            expected.append(tuple(values))
    log.close()
    got = log.as_dict()
    for index, name in enumerate(STEP_COLUMNS):
        np.testing.assert_array_equal(got[name], np.array([row[index] for row in expected]), err_msg=name)
