"""Per-request rows built column by column equal the same rows built one request at a time."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from backends.constant import ConstantCostModel
from policies.registry import make_policy
from simcore.cluster import simulate
from simcore.engine import RunLimits
from simcore.metrics import REQUEST_COLUMNS, request_frame
from tests.helpers import req
from tests.test_accelerate import workload


def _rows_one_by_one(requests) -> pd.DataFrame:
    """The straightforward reading: each request's row in turn, missing times NaN."""
    rows = []
    for r in requests:
        def time(value):  # noqa: ANN001, ANN202
            return math.nan if value is None else value

        scheduled, prefill_done = time(r.first_scheduled_s), time(r.prefill_done_s)
        first, last = time(r.first_token_s), time(r.last_token_s)
        rows.append((
            r.request_id, r.status.value, r.reject_reason, r.arrival_s, r.prompt_len, r.num_target_outputs,
            r.num_outputs, scheduled, prefill_done, first, last, time(r.finish_s),
            scheduled - r.arrival_s, prefill_done - scheduled, first - prefill_done, first - r.arrival_s,
            (last - first) / (r.num_outputs - 1) if r.num_outputs >= 2 else math.nan, last - r.arrival_s,
            r.num_preemptions, r.num_swaps, r.num_cached_prefix, r.num_prefix_query_tokens,
            r.num_prefix_hit_tokens, r.num_recomputed_tokens, r.swap_delay_s, r.recompute_delay_s,
            r.session_id, r.turn, r.cache_salt, r.adapter_id,
        ))
    return pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))


@pytest.mark.parametrize("seed", [1, 2])
def test_columns_equal_rows_for_finished_rejected_and_unfinished_requests(seed):
    # Tight memory rejects some requests, a horizon leaves others unfinished or never scheduled,
    # sessions and prefix content fill the optional columns.
    requests = [*workload(seed, content=True, sessions=True), req(99, 0.001, 5, 1)]  # one output: no TPOT
    policy = make_policy("chunked_prefill", num_blocks=12, block_size=4, prefix_caching=True, chunk_size=16,
                         max_num_seqs=6, max_num_batched_tokens=64, max_model_len=80)
    result = simulate(requests, policy, ConstantCostModel(step_s=0.01, per_token_s=1e-4),
                      limits=RunLimits(max_sim_time_s=1.0))
    done = result.requests
    assert {r.status.value for r in done} >= {"finished", "rejected", "unfinished"}
    assert any(r.num_outputs == 1 for r in done) and any(r.first_token_s is None for r in done)
    pd.testing.assert_frame_equal(request_frame(done), _rows_one_by_one(done), check_exact=True)


def test_no_requests_give_the_empty_frame():
    pd.testing.assert_frame_equal(request_frame([]), _rows_one_by_one([]))


def test_the_sink_gives_the_frame_of_all_its_batches():
    from experiments.request_sink import RequestSink

    requests = [*workload(3, content=True, sessions=True), req(99, 0.001, 5, 1)]
    policy = make_policy("continuous", num_blocks=12, block_size=4, max_num_seqs=6, max_model_len=80)
    result = simulate(requests, policy, ConstantCostModel(step_s=0.01, per_token_s=1e-4),
                      limits=RunLimits(max_sim_time_s=1.0))
    done = result.requests
    sink = RequestSink()
    for start in range(0, len(done), 7):  # batches in another order than the ids
        sink.add(done[::-1][start:start + 7])
    pd.testing.assert_frame_equal(sink.frame(), _rows_one_by_one(done), check_exact=True)
