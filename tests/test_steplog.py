"""Step records: single steps and runs (each field one value or a value a step) read back as the rows they stand for."""

from __future__ import annotations

import random

import numpy as np
import pytest

import simcore.steplog as steplog
from simcore.steplog import STEP_COLUMNS, StepLog, StepRecord

PER_STEP = ("step_id", "start_s", "duration_s")


def _random_run(rng: random.Random, first_step: int, num_steps: int) -> tuple[StepRecord, list[tuple]]:
    """A run's record, each field in a form add_run takes, and the rows it stands for."""
    fields, expanded = [], []
    for name in STEP_COLUMNS:
        if name == "step_id":
            fields.append(range(first_step, first_step + num_steps))
            expanded.append(list(range(first_step, first_step + num_steps)))
            continue
        make = (lambda: rng.random()) if name in steplog.FLOAT_COLUMNS else (lambda: rng.randrange(1000))
        if name not in PER_STEP and rng.random() < 0.5:
            value = make()
            fields.append(value)
            expanded.append([value] * num_steps)
        else:
            values = [make() for _ in range(num_steps)]
            fields.append(values)
            expanded.append(values)
    return StepRecord(*fields), list(zip(*expanded))


@pytest.mark.parametrize("spill", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_rows_and_runs_read_back_in_order(seed, spill, tmp_path, monkeypatch):
    monkeypatch.setattr(steplog, "CHUNK_ROWS", 37)  # chunks sealed mid-run and between runs
    rng = random.Random(seed)
    log = StepLog(tmp_path / "steps.parquet" if spill else None)
    expected: list[tuple] = []
    while len(expected) < 400:
        if rng.random() < 0.4:
            row = (len(expected), rng.random(), rng.random(), *(rng.randrange(1000) for _ in STEP_COLUMNS[3:]))
            log.add(StepRecord(*row))
            expected.append(row)
        else:
            record, rows = _random_run(rng, len(expected), rng.randint(1, 30))
            log.add_run(len(rows), record)
            expected.extend(rows)
    got = log.as_dict()
    for index, name in enumerate(STEP_COLUMNS):
        np.testing.assert_array_equal(got[name], [row[index] for row in expected], err_msg=name)
    assert len(log) == len(expected)


def test_a_run_whose_field_has_the_wrong_length_is_an_error():
    log = StepLog()
    record, rows = _random_run(random.Random(0), 0, 5)
    log.add_run(len(rows), record._replace(num_waiting=[1, 2, 3]))  # three values for a run of five steps
    with pytest.raises(ValueError, match="num_waiting: 3 values for a run of 5 steps"):
        log.as_dict()


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
                log.add(StepRecord(*row), extras_at.get(i))
            else:  # runs, too, between the rows
                log.add_run(1, StepRecord((i,), (float(i),), (1.0,), *row[3:]))
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
    from simcore.cluster import simulate
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
