"""A step plan reads the same whether its decodes come as columns or one by one."""

from __future__ import annotations

import pickle

from simcore.plan import Decodes, Repeat, ScheduledSeq, StepPlan

DECODES = [ScheduledSeq(7, 1, 130, True, 100), ScheduledSeq(3, 1, 45, True, 20), ScheduledSeq(9, 1, 12, True, 12)]
CHUNK = ScheduledSeq(4, 64, 128, False, 500)


def _columns(step_id: int = 5) -> StepPlan:
    return StepPlan(step_id, (CHUNK,), decodes=Decodes([s.request_id for s in DECODES],
                                                       [s.context_len for s in DECODES],
                                                       [s.prompt_len for s in DECODES]))


def test_columns_read_as_the_sequences_they_stand_for():
    columns, listed = _columns(), StepPlan(5, (*DECODES, CHUNK))
    assert columns.seqs == (*DECODES, CHUNK)  # the decodes first, in order
    assert columns == listed and repr(columns) == repr(listed)
    for name in ("num_batched_tokens", "num_prefill_tokens", "num_decode_tokens", "num_selecting", "num_seqs"):
        assert getattr(columns, name) == getattr(listed, name), name
    assert (columns.num_batched_tokens, columns.num_decode_tokens, columns.num_selecting) == (67, 3, 3)


def test_without_drops_sequences_by_batch_position_and_keeps_columns():
    plan = _columns().without([1, 3])
    assert plan.seqs == (DECODES[0], DECODES[2])
    assert plan.decodes.request_ids == [7, 9] and plan.listed == ()


def test_a_plan_pickles_and_copies_as_its_sequences():
    plan = _columns()
    again = pickle.loads(pickle.dumps(plan))
    assert again == plan and again.num_decode_tokens == 3 and again.seqs == plan.seqs


def test_a_repeat_advances_every_context_by_its_new_positions():
    plans = list(Repeat(_columns().without((0,)), 2, advance=1).plans())
    assert [p.step_id for p in plans] == [6, 7]
    assert [s.context_len for s in plans[1].seqs] == [47, 14, 256]
