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
