"""Paged-KV semantics of the engine: physical layout, prefix sharing, copy-on-write, swaps,
recompute and sampling never change what a request computes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from backends.torch.sampling import SamplingParams  # noqa: E402
from tests.test_torch_support import engine_for, seq, step, tiny_spec  # noqa: E402

SPEC = tiny_spec(kv_heads=2, vocab=128)
TIGHT = dict(atol=1e-5, rtol=1e-5)


def prompt_of(n: int, offset: int = 1) -> list[int]:
    return [(offset + 5 * i) % 128 for i in range(n)]


def run_alone(prompt: list[int], decodes: int, *, rid: int = 1) -> tuple[list[torch.Tensor], list[int]]:
    """Logits of prefill + decodes of one request on a fresh engine with blocks 0, 1, 2, ..."""
    engine = engine_for(SPEC, num_blocks=32)
    engine.keep_logits = "selected"
    table = list(range(16))
    logits = []
    engine.execute(step(seq(rid, len(prompt), 0, prompt, table)))
    logits.append(engine.last_logits[rid])
    for k in range(decodes):
        engine.execute(step(seq(rid, 1, len(prompt) + k, prompt, table)))
        logits.append(engine.last_logits[rid])
    return logits, engine.output_token_ids(rid)


def test_shuffled_physical_blocks_change_nothing():
    prompt = prompt_of(22)
    alone, tokens = run_alone(prompt, 5)
    engine = engine_for(SPEC, num_blocks=32)
    engine.keep_logits = "selected"
    table = [int(b) for b in torch.randperm(32, generator=torch.Generator().manual_seed(1))[:8]]
    engine.execute(step(seq(1, 22, 0, prompt, table)))
    got = [engine.last_logits[1]]
    for k in range(5):
        engine.execute(step(seq(1, 1, 22 + k, prompt, table)))
        got.append(engine.last_logits[1])
    for a, b in zip(alone, got, strict=True):
        torch.testing.assert_close(a, b, **TIGHT)
    assert engine.output_token_ids(1) == tokens


def test_shared_prefix_blocks_give_each_request_its_own_logits():
    common = prompt_of(16, offset=3)  # four full blocks of 4
    prompt_a, prompt_b = common + prompt_of(5, 60), common + prompt_of(7, 90)
    alone_a, _ = run_alone(prompt_a, 3, rid=1)
    alone_b, _ = run_alone(prompt_b, 3, rid=2)
    engine = engine_for(SPEC, num_blocks=32)
    engine.keep_logits = "selected"
    table_a = [7, 3, 11, 5, 20, 21, 22]
    table_b = [7, 3, 11, 5, 24, 25, 26, 27]  # the same physical blocks for the common prefix
    engine.execute(step(seq(1, 21, 0, prompt_a, table_a)))
    got_a = [engine.last_logits[1]]
    # B is a prefix-cache hit: its first 16 positions are already in the pool.
    engine.execute(step(seq(2, 7, 16, prompt_b, table_b)))
    got_b = [engine.last_logits[2]]
    for k in range(3):
        engine.execute(step(seq(1, 1, 21 + k, prompt_a, table_a), seq(2, 1, 23 + k, prompt_b, table_b)))
        got_a.append(engine.last_logits[1])
        got_b.append(engine.last_logits[2])
    for alone, got in ((alone_a, got_a), (alone_b, got_b)):
        for x, y in zip(alone, got, strict=True):
            torch.testing.assert_close(x, y, **TIGHT)


def test_copy_on_write_of_a_partly_filled_shared_block():
    prompt_a = prompt_of(18, offset=9)  # 4 full blocks + block 4 holding 2 positions
    prompt_b = prompt_a + prompt_of(4, 77)  # B forks A after position 17
    alone_a, _ = run_alone(prompt_a, 4, rid=1)
    alone_b, _ = run_alone(prompt_b, 3, rid=2)
    engine = engine_for(SPEC, num_blocks=32)
    engine.keep_logits = "selected"
    table_a = [2, 4, 6, 8, 10, 12]
    engine.execute(step(seq(1, 18, 0, prompt_a, table_a)))
    got_a = [engine.last_logits[1]]
    # B shares A's blocks; writing position 18 into the shared partial block 10 needs a copy first.
    table_b = [2, 4, 6, 8, 30, 31, 14]
    engine.execute(step(seq(2, 4, 18, prompt_b, table_b), seq(1, 1, 18, prompt_a, table_a),
                        blocks_to_copy=((10, 30),)))
    got_a.append(engine.last_logits[1])
    got_b = [engine.last_logits[2]]
    for k in range(3):  # both keep writing into their own copies of the old partial block
        engine.execute(step(seq(1, 1, 19 + k, prompt_a, table_a), seq(2, 1, 22 + k, prompt_b, table_b)))
        got_a.append(engine.last_logits[1])
        got_b.append(engine.last_logits[2])
    for alone, got in ((alone_a, got_a), (alone_b, got_b)):
        for x, y in zip(alone, got, strict=True):
            torch.testing.assert_close(x, y, **TIGHT)


def test_swap_out_and_in_keeps_logits():
    prompt = prompt_of(14, offset=2)
    alone, tokens = run_alone(prompt, 4)
    engine = engine_for(SPEC, num_blocks=16, host_blocks=8)
    engine.keep_logits = "selected"
    engine.execute(step(seq(1, 14, 0, prompt, [0, 1, 2, 3])))
    got = [engine.last_logits[1]]
    engine.execute(step(seq(1, 1, 14, prompt, [0, 1, 2, 3])))
    got.append(engine.last_logits[1])
    # Offload all four blocks, let another request overwrite them, bring them back elsewhere.
    engine.execute(step(blocks_to_swap_out=((0, 5), (1, 2), (2, 7), (3, 0))))
    engine.execute(step(seq(9, 16, 0, prompt_of(16, 40), [0, 1, 2, 3])))
    new_table = [12, 9, 14, 11]
    engine.execute(step(seq(1, 1, 15, prompt, new_table),
                        blocks_to_swap_in=((5, 12), (2, 9), (7, 14), (0, 11))))
    got.append(engine.last_logits[1])
    for k in range(2):
        engine.execute(step(seq(1, 1, 16 + k, prompt, new_table + [13])))
        got.append(engine.last_logits[1])
    for x, y in zip(alone, got, strict=True):
        torch.testing.assert_close(x, y, **TIGHT)
    assert engine.output_token_ids(1) == tokens


def test_recompute_after_preemption_reproduces_tokens():
    prompt = prompt_of(11, offset=4)
    _, tokens = run_alone(prompt, 6)  # 7 outputs
    engine = engine_for(SPEC, num_blocks=32)
    table = [0, 1, 2, 3, 4]
    engine.execute(step(seq(1, 11, 0, prompt, table)))
    for k in range(3):
        engine.execute(step(seq(1, 1, 11 + k, prompt, table)))
    assert engine.output_token_ids(1) == tokens[:4]
    # Preempted: blocks lost. Recompute prompt + outputs in new blocks, in chunks; the chunk
    # ending at an already selected output must not select it again.
    new_table = [20, 21, 22, 23, 24]
    engine.execute(step(seq(1, 12, 0, prompt, new_table)))  # ends at output 1: already known
    assert engine.output_token_ids(1) == tokens[:4]
    new = engine.execute(step(seq(1, 3, 12, prompt, new_table)))  # reaches the last known token
    assert new == {1: tokens[4]}
    for k in range(2):
        engine.execute(step(seq(1, 1, 15 + k, prompt, new_table)))
    assert engine.output_token_ids(1) == tokens


def test_processing_an_unselected_position_is_an_error():
    engine = engine_for(SPEC, num_blocks=8)
    engine.execute(step(seq(1, 5, 0, prompt_of(5), [0, 1])))
    with pytest.raises(RuntimeError, match="only 6 tokens are known"):
        engine.execute(step(seq(1, 2, 5, prompt_of(5), [0, 1])))


def test_block_table_too_short_or_out_of_pool_is_an_error():
    engine = engine_for(SPEC, num_blocks=8)
    with pytest.raises(RuntimeError, match="block table has 1 blocks"):
        engine.execute(step(seq(1, 5, 0, prompt_of(5), [0])))
    with pytest.raises(RuntimeError, match="outside the pool"):
        engine.execute(step(seq(2, 5, 0, prompt_of(5), [0, 8])))


def test_synthetic_prompts_are_deterministic_per_seed_and_request():
    def tokens(seed: int, rid: int) -> list[int]:
        engine = engine_for(SPEC, num_blocks=8, seed=seed)
        engine.execute(step(seq(rid, 9, 0, 9, [0, 1, 2])))
        engine.execute(step(seq(rid, 1, 9, 9, [0, 1, 2])))
        return engine.output_token_ids(rid)

    assert tokens(0, 5) == tokens(0, 5)
    assert tokens(0, 5) != tokens(1, 5) or tokens(0, 6) != tokens(0, 5)


def test_temperature_sampling_is_independent_of_batch_company():
    sampling = SamplingParams(temperature=1.0, top_p=0.9)
    prompt = prompt_of(10, offset=8)

    def run(with_company: bool, seed: int = 0) -> list[int]:
        engine = engine_for(SPEC, num_blocks=32, sampling=sampling, seed=seed)
        others = [seq(7, 6, 0, prompt_of(6, 33), [10, 11])] if with_company else []
        engine.execute(step(seq(1, 10, 0, prompt, [0, 1, 2, 3]), *others))
        for k in range(5):
            more = [seq(7, 1, 6 + k, prompt_of(6, 33), [10, 11, 12])] if with_company else []
            engine.execute(step(*more, seq(1, 1, 10 + k, prompt, [0, 1, 2, 3])))
        return engine.output_token_ids(1)

    alone = run(False)
    assert run(True) == alone
    assert len(set(alone)) > 1
    assert any(run(False, seed=s) != alone for s in (1, 2, 3))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_path_matches_portable():
    prompt_a, prompt_b = prompt_of(13), prompt_of(6, 50)
    results = {}
    for attention in ("portable", "flex"):
        engine = engine_for(SPEC, num_blocks=32, attention=attention)
        engine.keep_logits = "all"
        engine.execute(step(seq(1, 13, 0, prompt_a, [5, 9, 1, 30]), seq(2, 6, 0, prompt_b, [2, 3])))
        engine.execute(step(seq(1, 1, 13, prompt_a, [5, 9, 1, 30]), seq(2, 1, 6, prompt_b, [2, 3])))
        results[attention] = (dict(engine.last_logits), engine.output_token_ids(1), engine.output_token_ids(2))
    for rid in (1, 2):
        torch.testing.assert_close(results["portable"][0][rid], results["flex"][0][rid], **TIGHT)
    assert results["portable"][1:] == results["flex"][1:]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_padded_layout_matches_portable():
    from backends.torch.attention import AttentionMetadata, PortableDecode
    from backends.torch.flex_decode import FlexDecode

    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(40, 4, 2, 16, generator=gen), torch.randn(40, 4, 2, 16, generator=gen)
    q = torch.randn(3, 4, 16, generator=gen)
    lens = torch.tensor([1, 5, 37])
    tables = torch.stack([torch.randperm(40, generator=gen)[:10] for _ in lens])
    outs = []
    for backend in (PortableDecode(), FlexDecode(compiled=False, max_blocks_per_seq=16, pad=True)):
        meta = AttentionMetadata(slot_mapping=torch.zeros(3, dtype=torch.long), num_decode=3,
                                 decode_block_tables=tables, decode_seq_lens=lens, decode_max_len=37)
        backend.begin_step(meta)
        outs.append(backend(q, k, v, meta, 0.25))
    torch.testing.assert_close(outs[0], outs[1], **TIGHT)


def test_one_step_of_several_pieces_and_decodes_matches_each_alone():
    # Step 2 holds a decode, a chunk with context (A's second chunk) and a whole prompt (C):
    # the pieces share one padded attention call per layer and must not see one another.
    prompt_a, prompt_b, prompt_c = prompt_of(22, 1), prompt_of(13, 40), prompt_of(9, 70)
    alone = {rid: run_alone(p, 1, rid=rid)[0] for rid, p in ((1, prompt_a), (2, prompt_b), (3, prompt_c))}
    engine = engine_for(SPEC, num_blocks=32)
    engine.keep_logits = "selected"
    table_a, table_b, table_c = [20, 3, 9, 14, 1, 30], [7, 11, 2, 25], [5, 17, 28]
    engine.execute(step(seq(1, 10, 0, prompt_a, table_a, selects=False), seq(2, 13, 0, prompt_b, table_b)))
    torch.testing.assert_close(engine.last_logits[2], alone[2][0], **TIGHT)
    engine.execute(step(seq(3, 9, 0, prompt_c, table_c), seq(2, 1, 13, prompt_b, table_b),
                        seq(1, 12, 10, prompt_a, table_a)))
    torch.testing.assert_close(engine.last_logits[1], alone[1][0], **TIGHT)
    torch.testing.assert_close(engine.last_logits[2], alone[2][1], **TIGHT)
    torch.testing.assert_close(engine.last_logits[3], alone[3][0], **TIGHT)
