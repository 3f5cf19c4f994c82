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


def test_a_run_whose_column_list_has_the_wrong_length_is_an_error():
    log = StepLog()
    rng = random.Random(0)
    columns, rows = _random_run(rng, 0, 5)
    columns = list(columns)
    columns[STEP_COLUMNS.index("num_waiting")] = [1, 2, 3]  # three values for a run of five steps
    columns[STEP_COLUMNS.index("num_seqs")] = (4, 7)  # so that the column is not one value throughout
    log.add_run(len(rows), tuple(columns))
    with pytest.raises(ValueError, match="a run of 5 steps has 3 values"):
        log.as_dict()


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
                        rng.random() < 0.5, rng.random() < 0.5,
                        last=(rng.randrange(9), rng.randrange(99), rng.randrange(999)))
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


def test_extra_columns_first_seen_after_a_spilled_chunk(tmp_path, monkeypatch):
    """A spill file's columns are fixed when it is opened: an extra column that first appears in
    a later chunk (a swap's link time, after thousands of steps without one) goes to a new part,
    and closing merges the parts into one file that reads back as the in-memory log does, the
    earlier rows NaN in it. (This crashed long offload runs written as Parquet.)"""
    monkeypatch.setattr(steplog, "CHUNK_ROWS", 10)
    logs = [StepLog(tmp_path / "steps.parquet"), StepLog(None)]
    extras_at = {25: {"transfer_s": 0.5}, 26: {"transfer_s": 0.25}, 41: {"measured_s": 1.5}, 57: {"transfer_s": 0.125}}
    for log in logs:
        for i in range(60):
            row = (i, float(i), 1.0, *range(3, len(STEP_COLUMNS)))
            if i % 3:
                log.append(row, extras_at.get(i))
            else:  # runs, too, between the rows
                log.add_run(1, ((i,), (float(i),), (1.0,), *row[3:]))
        log.close()
    spilled, in_memory = (log.as_dict() for log in logs)
    assert logs[0].spilled and list(spilled) == list(in_memory) == [*STEP_COLUMNS, "transfer_s", "measured_s"]
    for name in in_memory:
        np.testing.assert_array_equal(spilled[name], in_memory[name], err_msg=name)
    assert in_memory["transfer_s"][25] == 0.5 and np.isnan(in_memory["transfer_s"][:25]).all()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["steps.parquet"]  # parts merged, removed


def test_an_offload_run_whose_first_swap_comes_after_a_spilled_chunk(tmp_path, monkeypatch):
    """End to end: the swap's link time appears only after the first chunk was spilled."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from policies.registry import make_policy
    from simcore.engine import simulate
    from simcore.presets import get_model
    from tests.helpers import req

    monkeypatch.setattr(steplog, "CHUNK_ROWS", 16)
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    # One decodes alone for a while; two long prompts then force it out to the host tier.
    requests = [req(0, 0.0, 16, 300), req(1, 0.5, 64, 200), req(2, 0.5, 64, 200)]
    tables = []
    for spill in (tmp_path / "steps.parquet", None):
        policy = make_policy("offload", base="continuous", num_blocks=24, block_size=16, num_host_blocks=200)
        tables.append(simulate(requests, policy, cost, steps_spill=spill).steps.as_dict())
    spilled, in_memory = tables
    first_swap = int(np.flatnonzero(in_memory["blocks_swapped_out"])[0])
    assert first_swap >= 16 and np.isnan(in_memory["transfer_s"][:first_swap]).all()
    assert list(spilled) == list(in_memory)
    for name in in_memory:
        np.testing.assert_array_equal(spilled[name], in_memory[name], err_msg=name)
