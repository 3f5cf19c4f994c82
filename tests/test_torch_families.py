"""Every supported family beyond Llama against transformers: a tiny random checkpoint saved with
save_pretrained, read back through config.json and safetensors, and run by the engine alone,
batched, under chunked prefill and across swap and recompute preemption. Windows are 8
positions and prompts longer, so the sliding layers really slide."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from backends.torch.factory import build_engine  # noqa: E402
from simcore.hf_config import load_hf_config  # noqa: E402
from tests.test_torch_support import (  # noqa: E402
    ATOL,
    CPU,
    check_chunks_then_decodes,
    hf_generate,
    hf_logits,
    prompt_of,
    seq,
    step,
)

WINDOW = 8
COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
              pad_token_id=None)
SLIDING_THEN_FULL = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]

# family -> its transformers config: each switches on what the family adds (small soft-caps and
# an odd query_pre_attn_scalar so they change the numbers; a scaled RoPE on Gemma 3's global layer).
CONFIGS = {
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=16, use_sliding_window=True,
                                              sliding_window=WINDOW, max_window_layers=2),
    "gemma2": lambda: transformers.Gemma2Config(**COMMON, head_dim=16, sliding_window=WINDOW,
                                                query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                                                final_logit_softcapping=3.0),
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **COMMON, head_dim=16, sliding_window=WINDOW, layer_types=SLIDING_THEN_FULL, query_pre_attn_scalar=24,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    "phi3": lambda: transformers.Phi3Config(**COMMON, sliding_window=WINDOW),
    "mistral": lambda: transformers.MistralConfig(**COMMON, sliding_window=WINDOW),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def family(request, tmp_path_factory):
    """(checkpoint folder, transformers model) with random weights, norms included."""
    warnings.filterwarnings("ignore", module="transformers")
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(CONFIGS[request.param]())
    gemma = request.param.startswith("gemma")
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:  # Gemma's norms scale by (1 + w): both conventions around 1
                p.normal_(0.0 if gemma else 1.0, 0.2)
            else:
                p.normal_(0.0, 0.08)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    hf.generation_config.eos_token_id = None
    return folder, hf.eval()


def engine_of(folder, host_blocks: int = 0):
    return build_engine(load_hf_config(folder), device=CPU, dtype=torch.float32, num_blocks=48, block_size=4,
                        num_host_blocks=host_blocks, weights=folder, attention="portable")


def test_spec_matches_the_transformers_model(family):
    folder, hf = family
    spec = load_hf_config(folder)
    assert spec.num_params == sum(p.numel() for p in hf.parameters())
    types = getattr(hf.config, "layer_types", None) or ["sliding_attention"] * spec.num_layers
    assert [spec.is_sliding(i) for i in range(spec.num_layers)] == [t == "sliding_attention" for t in types]
    assert spec.num_sliding_layers > 0 and spec.sliding_window == WINDOW


def test_chunked_prefill_and_decode_logits_match(family):
    folder, hf = family
    engine = engine_of(folder)
    engine.keep_logits = "all"
    prompt = prompt_of(37, offset=11)
    reference = hf_logits(hf, prompt)
    engine.execute(step(seq(9, 37, 0, prompt, range(10, 20))))  # the whole prompt at once
    torch.testing.assert_close(engine.last_logits[9], reference, atol=ATOL, rtol=0)
    check_chunks_then_decodes(engine, hf, prompt, num_decodes=5)


def test_batched_greedy_tokens_equal_generate(family):
    folder, hf = family
    engine = engine_of(folder)
    prompts = {1: prompt_of(13, 5), 2: prompt_of(22, 50), 3: prompt_of(6, 90)}
    tables = {1: list(range(0, 8)), 2: list(range(8, 17)), 3: list(range(17, 22))}
    num_new = 10
    # One step prefills all three (a padded batch of pieces), then they decode together.
    engine.execute(step(*(seq(r, len(p), 0, p, tables[r]) for r, p in prompts.items())))
    for k in range(num_new - 1):
        engine.execute(step(*(seq(r, 1, len(p) + k, p, tables[r]) for r, p in prompts.items())))
    for rid, prompt in prompts.items():
        assert engine.output_token_ids(rid) == hf_generate(hf, prompt, num_new), rid


def test_swap_and_recompute_preemption_keep_the_tokens(family):
    folder, hf = family
    prompt = prompt_of(14, offset=2)
    expected = hf_generate(hf, prompt, 9)
    # Swap: decode, offload the four blocks, let another request overwrite them, bring them back
    # elsewhere, and decode on next to a prefill chunk.
    engine = engine_of(folder, host_blocks=8)
    engine.execute(step(seq(1, 14, 0, prompt, [0, 1, 2, 3])))
    engine.execute(step(seq(1, 1, 14, prompt, [0, 1, 2, 3])))
    engine.execute(step(blocks_to_swap_out=((0, 5), (1, 2), (2, 7), (3, 0))))
    engine.execute(step(seq(9, 16, 0, prompt_of(16, 40), [0, 1, 2, 3])))
    table = [12, 9, 14, 11, 13, 15]
    engine.execute(step(seq(1, 1, 15, prompt, table), blocks_to_swap_in=((5, 12), (2, 9), (7, 14), (0, 11))))
    for k in range(6):
        engine.execute(step(seq(1, 1, 16 + k, prompt, table), seq(8, 5, 5 * k, prompt_of(30, 3), range(30, 38),
                                                                  selects=False)))
    assert engine.output_token_ids(1) == expected
    # Recompute: blocks lost after 4 outputs; prompt + outputs again in new blocks, in chunks.
    engine = engine_of(folder)
    engine.execute(step(seq(1, 14, 0, prompt, [0, 1, 2, 3])))
    for k in range(3):
        engine.execute(step(seq(1, 1, 14 + k, prompt, [0, 1, 2, 3, 4])))
    table = [20, 21, 22, 23, 24, 25]
    engine.execute(step(seq(1, 9, 0, prompt, table)))
    assert engine.execute(step(seq(1, 9, 9, prompt, table))) == {1: expected[4]}  # reaches the last known token
    for k in range(4):
        engine.execute(step(seq(1, 1, 18 + k, prompt, table)))
    assert engine.output_token_ids(1) == expected
