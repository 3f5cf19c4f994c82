"""Every worked example of docs/kv-cache.md, reproduced through servesim's public API."""

from __future__ import annotations

import pytest

from backends.constant import ConstantCostModel
from policies.registry import make_policy
from simcore.block_manager import BlockManager
from simcore.metrics import output_throughput, request_frame, summarize, tpot, ttft_parts
from simcore.model import ModelSpec, kv_cache_bytes, kv_cache_gib
from tests.helpers import drive, req, run


def tiny_model(layers: int, kv_heads: int, head_dim: int) -> ModelSpec:
    return ModelSpec(
        name="seed", num_layers=layers, hidden_size=kv_heads * head_dim, num_q_heads=kv_heads,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=8, vocab_size=16,
    )


# ---- 21.1: selection before the next cache append: 24 -> 32 bytes ----------------------------

def test_21_1_three_token_prompt_24_then_32_bytes():
    model = tiny_model(layers=1, kv_heads=1, head_dim=2)
    policy = make_policy("continuous", num_blocks=8, block_size=4)
    request = req(0, 0.0, prompt_len=3, output_len=2)
    policy.add(request, 0.0)
    drive(policy)  # prefill
    assert request.num_outputs == 1  # token four is selected...
    assert request.num_processed * model.kv_bytes_per_token(2) == 24  # ...but the cache holds 3 positions
    assert kv_cache_bytes(layers=1, batch=1, kv_heads=1, seq_len=3, head_dim=2) == 24
    drive(policy)  # the next call processes token four
    assert request.num_processed * model.kv_bytes_per_token(2) == 32
    assert kv_cache_bytes(layers=1, batch=1, kv_heads=1, seq_len=4, head_dim=2) == 32


def test_21_1_kv_cache_gib_estimate():
    kw = dict(layers=32, batch=1, seq_len=8192, head_dim=128)
    assert kv_cache_gib(kv_heads=8, **kw) == 1.0
    assert kv_cache_gib(kv_heads=2, **kw) == 0.25
    assert kv_cache_gib(kv_heads=1, **kw) == 0.125


# ---- 21.6: three passes after a five-token prompt: 1280, 1536, 1792, 2048 -------------------

def test_21_6_payload_follows_processing_not_selection():
    model = tiny_model(layers=2, kv_heads=4, head_dim=8)
    assert model.kv_bytes_per_token(2) == 256  # each pass adds 2(2)(1)(4)(8)(2) bytes
    policy = make_policy("continuous", num_blocks=8, block_size=4)
    request = req(0, 0.0, prompt_len=5, output_len=4)
    policy.add(request, 0.0)
    payloads, outputs = [], []
    for _ in range(4):
        drive(policy)
        payloads.append(request.num_processed * model.kv_bytes_per_token(2))
        outputs.append(request.num_outputs)
    assert payloads == [1280, 1536, 1792, 2048]
    assert outputs == [1, 2, 3, 4]
    # Four outputs selected, three post-prompt outputs processed: P + N - 1 positions.
    assert request.is_finished and request.num_processed == 5 + 4 - 1


def test_prompt_p_stopping_after_n_outputs_keeps_p_plus_n_minus_1_positions():
    requests = [req(i, 0.01 * i, prompt_len=3 + i, output_len=1 + (i % 5)) for i in range(20)]
    for name, opts in (("static", {}), ("continuous", {}), ("chunked_prefill", {"chunk_size": 3})):
        _, result = run(requests, name, **opts)
        for r in result.finished:
            assert r.num_processed == r.prompt_len + r.num_outputs - 1
            assert r.num_outputs == r.output_len


def test_max_tokens_caps_outputs():
    _, result = run([req(0, 0.0, prompt_len=4, output_len=50, max_tokens=7)], "continuous")
    assert result.finished[0].num_outputs == 7


# ---- 21.2: TTFT = 8 + 20 + 5 ms; TPOT = (180 - 100) / (5 - 1) -------------------------------

def test_21_2_ttft_parts_8_20_5():
    assert ttft_parts(8, 20, 5) == 33
    # Through the simulator: request 0 keeps the engine busy for 8 ms, so request 1 queues 8 ms;
    # its 20-token prefill costs 20 ms; selection/delivery adds 5 ms.
    requests = [req(0, 0.0, prompt_len=8, output_len=1), req(1, 0.0, prompt_len=20, output_len=1)]
    _, result = run(requests, "continuous", max_num_seqs=1, delivery_s=0.005,
                    cost=ConstantCostModel(step_s=0.0, per_token_s=0.001))
    row = request_frame(result.requests).set_index("request_id").loc[1]
    assert row["queue_s"] * 1000 == pytest.approx(8, abs=1e-9)
    assert row["prefill_s"] * 1000 == pytest.approx(20, abs=1e-9)
    assert row["delivery_s"] * 1000 == pytest.approx(5, abs=1e-9)
    assert row["ttft_s"] * 1000 == pytest.approx(33, abs=1e-9)


def test_21_2_tpot_180_100_5_tokens():
    assert tpot(0.100, 0.180, 5) == pytest.approx(0.020, abs=1e-15)
    assert (180 - 100) / (5 - 1) == 20
    # Through the simulator: 100 ms prefill, then four 20 ms decode steps.
    policy, result = run([req(0, 0.0, prompt_len=5, output_len=5)], "continuous",
                         cost=ConstantCostModel(step_s=0.0, per_token_s=0.020))
    row = request_frame(result.requests).iloc[0]
    assert row["ttft_s"] * 1000 == pytest.approx(100)
    assert row["e2el_s"] * 1000 == pytest.approx(180)
    assert row["tpot_s"] * 1000 == pytest.approx(20)
    summary = summarize(result.requests, itl=policy.itl)
    assert summary["mean_itl_ms"] == pytest.approx(20)
    assert policy.itl.num_samples == 4  # four gaps between five outputs


def test_tpot_undefined_for_one_token():
    assert tpot(0.1, 0.1, 1) != tpot(0.1, 0.1, 1)  # NaN


def test_21_2_batch_rate_is_not_request_tpot():
    assert output_throughput(40, 0.2) == 200
    assert 1 / output_throughput(40, 0.2) == 0.005
    # Four requests each producing a token every 20 ms: 200 tokens/s in aggregate, TPOT 20 ms.
    requests = [req(i, 0.0, prompt_len=1, output_len=11) for i in range(4)]
    _, result = run(requests, "continuous", cost=ConstantCostModel(step_s=0.020))
    frame = request_frame(result.requests)
    assert frame["tpot_s"].tolist() == pytest.approx([0.020] * 4)
    steady = 4 / 0.020
    assert steady == 200


# ---- 21.3: two slots, A and B decoding, C waiting ---------------------------------------------

def test_21_3_continuous_admits_c_when_a_finishes_static_waits_for_b():
    def workload():
        return [req(0, 0.0, 4, 3), req(1, 0.0, 4, 12), req(2, 0.001, 4, 3)]

    starts = {}
    for name, opts in (("static", {"max_batch_size": 2}), ("continuous", {"max_num_seqs": 2})):
        _, result = run(workload(), name, **opts)
        by_id = {r.request_id: r for r in result.finished}
        a, b, c = by_id[0], by_id[1], by_id[2]
        starts[name] = c.first_scheduled_s
        if name == "continuous":
            assert c.first_scheduled_s == pytest.approx(a.finish_s)  # right after A retires
            assert c.first_scheduled_s < b.finish_s
        else:
            assert c.first_scheduled_s == pytest.approx(b.finish_s)  # waits for the whole group
    assert starts["continuous"] < starts["static"]


# ---- 21.3: a 12-token prompt in chunks of 4 beside two decoding requests --------------------

def _twelve_token_schedule(policy_name: str, **opts):
    policy = make_policy(policy_name, num_blocks=100, block_size=4, max_num_batched_tokens=64, **opts)
    a, b = req(0, 0.0, 4, 50), req(1, 0.0, 4, 50)
    policy.add(a, 0.0)
    policy.add(b, 0.0)
    now = 0.0
    _, now = drive(policy, now)  # A and B prefill; both are now decoding
    c = req(2, now, 12, 3)
    policy.add(c, now)
    steps = []
    while c.num_outputs == 0:
        plan, now = drive(policy, now)
        steps.append({s.request_id: s.num_new_tokens for s in plan.seqs})
    return steps, c


def test_21_3_chunked_prefill_stall_free_carries_decodes_with_each_chunk():
    steps, c = _twelve_token_schedule("chunked_prefill", chunk_size=4)
    assert steps == [{0: 1, 1: 1, 2: 4}] * 3  # three chunks of 4, each beside a decode of A and B
    assert c.num_outputs == 1  # the first token came from the third chunk


def test_21_3_chunked_prefill_alternate_order_matches_the_seed():
    steps, _ = _twelve_token_schedule("chunked_prefill", chunk_size=4, order="alternate")
    assert steps == [{2: 4}, {0: 1, 1: 1}, {2: 4}, {0: 1, 1: 1}, {2: 4}]


def test_21_3_without_chunking_the_whole_prompt_runs_before_the_next_decode():
    steps, _ = _twelve_token_schedule("continuous")
    assert steps == [{2: 12}]


def test_chunk_steps_are_visible_in_step_records():
    requests = [req(0, 0.0, 4, 40), req(1, 0.0, 4, 40), req(2, 0.015, 12, 2)]
    _, result = run(requests, "chunked_prefill", chunk_size=4)
    steps = result.steps.as_dict()
    prefill = [p for p in steps["num_prefill_tokens"] if p]
    assert prefill[:1] == [8] and prefill[1:4] == [4, 4, 4]
    c = next(r for r in result.finished if r.request_id == 2)
    # Request 2's first token is selected at the end of the step carrying its third chunk.
    third_chunk_step = [i for i, p in enumerate(steps["num_prefill_tokens"]) if p == 4][2]
    end = steps["start_s"][third_chunk_step] + steps["duration_s"][third_chunk_step]
    assert c.prefill_done_s == pytest.approx(end)


# ---- 21.5: Table 21.1's block steps -------------------------------------------------------

def test_21_5_table_21_1_allocation_append_share_release():
    bm = BlockManager(10, 4, free_block_order=[7, 2, 9, 5, 0, 1, 3, 4, 6, 8])
    A, B, C = 0, 1, 2
    bm.allocate(A, 0)
    bm.append(A, 6)
    bm.allocate(B, 0)
    bm.append(B, 4)
    assert bm.table(A) == (7, 2) and bm.table(B) == (9,)
    assert [bm.num_filled[b] for b in bm.table(A)] == [4, 2]
    assert bm.num_filled[9] == 4
    assert bm.locate(A, 5) == (2, 1)  # logical token 5: logical block 1, slot 1 -> physical 2
    # 1. positions 6 and 7 fill block 2.
    bm.append(A, 1)
    assert bm.locate(A, 6) == (2, 2)
    bm.append(A, 1)
    assert bm.num_filled[2] == 4
    # 2. position 8 needs logical block 2: free block 5, slot 0; three slots unused.
    bm.append(A, 1)
    assert bm.table(A) == (7, 2, 5)
    assert bm.locate(A, 8) == (5, 0)
    assert bm.num_filled[5] == 1
    # 3. C shares A's complete first block 7: reference count two.
    bm.share(C, A, 4)
    assert bm.table(C) == (7,)
    assert bm.ref_counts[7] == 2
    # 4. A finishes: 2 and 5 return to the free pool, 7 stays live for C, B keeps 9.
    bm.free(A)
    assert 2 in bm.free_blocks and 5 in bm.free_blocks
    assert 7 not in bm.free_blocks and bm.ref_counts[7] == 1
    assert bm.ref_counts[9] == 1
    # 5. C finishes: 7 becomes free (immediate release); B's completion releases 9.
    bm.free(C)
    assert 7 in bm.free_blocks
    bm.free(B)
    assert 9 in bm.free_blocks
    assert bm.num_free_blocks == 10
    bm.check()


def test_21_5_retention_keeps_a_released_block_as_evictable_cache_entry():
    bm = BlockManager(4, 4, enable_prefix_caching=True)
    bm.allocate(0, 0)
    bm.append(0, 4)
    block = bm.table(0)[0]
    bm.cache_block(block, block_hash=123, content=("x",))
    bm.free(0)
    assert block not in bm.free_blocks and block in bm.evictable
    assert bm.num_free_blocks == 4  # still available on demand


def test_21_5_copy_on_write_of_shared_partial_block():
    bm = BlockManager(8, 4)
    bm.allocate(0, 0)
    bm.append(0, 6)  # blocks: one full, one with 2 of 4 slots
    bm.share(1, 0, 6)
    shared_partial = bm.table(0)[1]
    assert bm.ref_counts[shared_partial] == 2
    copies = bm.append(1, 1)
    assert len(copies) == 1 and copies[0][0] == shared_partial
    private = copies[0][1]
    assert bm.table(1)[1] == private and bm.table(0)[1] == shared_partial
    assert bm.ref_counts[shared_partial] == 1 and bm.ref_counts[private] == 1
    assert bm.num_filled[private] == 3
    bm.check()
