"""A run's step-record counts, derived in bulk, equal those counted one step at a time."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.run_counts import RunCounts, expand_run_counts


@st.composite
def runs(draw, block_size: int) -> RunCounts:
    num_steps = draw(st.integers(2, 40))
    firsts = draw(st.lists(st.integers(1, 3 * block_size), max_size=10))
    chunk = draw(st.sampled_from([0, 0, 1, 5, 17]))
    departures = []
    if firsts:
        leaving = draw(st.lists(st.integers(0, len(firsts) - 1), unique=True, max_size=len(firsts)))
        departures = sorted((draw(st.integers(1, num_steps - 1)), index, draw(st.integers(0, 500)),
                             draw(st.integers(0, 9))) for index in leaving)
    num_newcomers = draw(st.integers(0, 3))
    chunk_cap = chunk + draw(st.integers(0, 6)) if chunk and departures and draw(st.booleans()) else 0
    completes = draw(st.booleans())
    return RunCounts(num_steps, block_size, draw(st.integers(len(firsts), 60)), draw(st.integers(0, 900)),
                     draw(st.integers(0, 9000)), firsts, departures, chunk,
                     draw(st.integers(1, 3 * block_size)) if chunk else 0, draw(st.booleans()), completes,
                     num_newcomers=num_newcomers, num_newcomers_selecting=draw(st.integers(0, num_newcomers)),
                     chunk_cap=chunk_cap,
                     last=(draw(st.integers(0, 99)), draw(st.integers(0, 999)), draw(st.integers(0, 9999))),
                     tail=draw(st.integers(1, 20)) if completes else 0,
                     newcomer_positions=draw(st.integers(1, 30)) if num_newcomers else 0)


def _one_step_at_a_time(run: RunCounts) -> dict[str, list[int]]:
    bs, q = run.block_size, run.chunk
    finish = {index: (step, context, held) for step, index, context, held in run.departures}
    taken = [0] * len(run.firsts)  # blocks each decoder has taken in the run
    out: dict[str, list[int]] = {name: [] for name in ("num_decode_tokens", "num_seqs", "num_selected", "num_running",
                                                      "kv_blocks_used", "resident_tokens", "num_prefill_tokens")}
    stored = 0  # tokens stored by the run's steps
    prompt_stored = 0  # of which the prompt's
    for step in range(1, run.num_steps + 1):
        active = [i for i in range(len(run.firsts)) if i not in finish or finish[i][0] >= step]
        if run.chunk_cap:  # the budget left beside the decoders, up to the cap
            q = min(run.chunk_cap, run.chunk + len(run.firsts) - len(active))
        last = step == run.num_steps
        out["num_decode_tokens"].append(len(active))
        out["num_seqs"].append(len(active) + run.has_prompt + (run.num_newcomers if last else 0))
        out["num_selected"].append(len(active) + (run.completes and last) + (run.num_newcomers_selecting if last else 0))
        # The prompt's chunk, or at the last step its tail where it completes, and the newcomers' chunks.
        out["num_prefill_tokens"].append((run.tail if run.completes and last else q) +
                                         (run.newcomer_positions if last else 0))
        for i in active:
            if step >= run.firsts[i] and (step - run.firsts[i]) % bs == 0:
                taken[i] += 1
        stored += len(active) + q
        prompt_stored += q
        if last:
            for name, value in zip(("num_running", "kv_blocks_used", "resident_tokens"), run.last):
                out[name].append(value)
            break
        gone = [i for i in finish if finish[i][0] <= step]
        released = sum(finish[i][2] + taken[i] for i in gone)
        prompt_blocks = 0
        if q and prompt_stored >= run.prompt_first:
            prompt_blocks = (prompt_stored - run.prompt_first) // bs + 1
        out["num_running"].append(run.running - len(gone))
        out["kv_blocks_used"].append(run.blocks + sum(taken) - released + prompt_blocks)
        out["resident_tokens"].append(run.resident + stored - sum(finish[i][1] + finish[i][0] for i in gone))
    return out


@settings(max_examples=200, deadline=None)
@given(data=st.data(), block_size=st.integers(1, 16), num_runs=st.integers(1, 5))
def test_bulk_counts_equal_counting_step_by_step(data, block_size, num_runs):
    many = [data.draw(runs(block_size)) for _ in range(num_runs)]
    got = expand_run_counts(many)
    for name, column in got.items():
        want = [value for run in many for value in _one_step_at_a_time(run)[name]]
        assert column.dtype == np.int64
        assert column.tolist() == want, name
