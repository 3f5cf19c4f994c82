"""Helpers shared by the torch-backend tests (no tests here): tiny HF oracles and engines."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from backends.torch.factory import build_engine  # noqa: E402
from backends.torch.weights import load_hf_state  # noqa: E402
from simcore.model import ModelSpec  # noqa: E402
from simcore.plan import ScheduledSeq, StepPlan  # noqa: E402

CPU = torch.device("cpu")
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 32}


def tiny_spec(*, kv_heads: int = 2, tied: bool = False, rope_scaling: dict | None = None, bias: bool = False,
              vocab: int = 128, layers: int = 2) -> ModelSpec:
    return ModelSpec(name="tiny-test", num_layers=layers, hidden_size=64, num_q_heads=4, num_kv_heads=kv_heads,
                     head_dim=16, intermediate_size=96, vocab_size=vocab, tie_word_embeddings=tied,
                     rope_theta=10000.0, rope_scaling=rope_scaling, max_position_embeddings=256,
                     rms_norm_eps=1e-6, attention_bias=bias)


def hf_model(spec: ModelSpec, seed: int = 0):
    """A transformers model with random weights and the same geometry (the oracle)."""
    transformers = pytest.importorskip("transformers")
    warnings.filterwarnings("ignore", module="transformers")
    common = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_q_heads,
        num_key_value_heads=spec.num_kv_heads, max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps, tie_word_embeddings=spec.tie_word_embeddings, rope_theta=spec.rope_theta,
    )
    if spec.rope_scaling:
        common["rope_scaling"] = dict(spec.rope_scaling)
    torch.manual_seed(seed)
    if spec.attention_bias:
        config = transformers.Qwen2Config(**common, use_sliding_window=False)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(config)
    # Larger-than-default weights make logits differ clearly, so tolerances mean something.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.08)
    return model.eval()


def engine_for(spec: ModelSpec, *, num_blocks: int = 64, block_size: int = 4, host_blocks: int = 0,
               attention: str = "portable", seed: int = 0, hf=None, sampling=None):
    engine = build_engine(spec, device=CPU, dtype=torch.float32, num_blocks=num_blocks, block_size=block_size,
                          num_host_blocks=host_blocks, seed=seed, attention=attention, sampling=sampling)
    if hf is not None:
        load_hf_state(engine.model, hf.state_dict().items())
    return engine


def seq(rid: int, new: int, context: int, prompt: list[int] | int, table, selects: bool = True) -> ScheduledSeq:
    """A scheduled seq; `prompt` is the token list, or just a length for a synthetic prompt."""
    ids = None if isinstance(prompt, int) else tuple(prompt)
    prompt_len = prompt if isinstance(prompt, int) else len(prompt)
    return ScheduledSeq(rid, new, context, selects, prompt_len, tuple(table), ids)


def step(*seqs: ScheduledSeq, step_id: int = 0, **moves) -> StepPlan:
    return StepPlan(step_id, tuple(seqs), **moves)


def hf_logits(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


# Logits of the engine and of transformers agree this closely in fp32.
ATOL = 2e-4
# Scattered physical blocks for a 37-token prompt in blocks of 4.
SCATTERED_TABLE = [9, 2, 30, 4, 17, 6, 12, 8, 21, 1, 40, 3]


def prompt_of(n: int, offset: int = 3, vocab: int = 128) -> list[int]:
    return [(offset + 7 * i) % vocab for i in range(n)]


def hf_generate(hf, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy outputs for `prompt`."""
    out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, use_cache=True,
                      attention_mask=torch.ones(1, len(prompt), dtype=torch.long), pad_token_id=0)
    return out[0, len(prompt):].tolist()


def check_chunks_then_decodes(engine, hf, prompt: list[int], num_decodes: int) -> None:  # noqa: ANN001
    """Request 1 prefilled in chunks whose edges fall inside blocks, then decoded: each step's
    logits against transformers' on the whole sequence (the engine keeps every logit)."""
    reference = hf_logits(hf, prompt)
    start = 0
    for chunk in (10, 13, 14):
        new = engine.execute(step(seq(1, chunk, start, prompt, SCATTERED_TABLE, selects=start + chunk == len(prompt))))
        torch.testing.assert_close(engine.last_logits[1], reference[start:start + chunk], atol=ATOL, rtol=0)
        start += chunk
    tokens = prompt + [new[1]]
    for _ in range(num_decodes):
        new = engine.execute(step(seq(1, 1, len(tokens) - 1, prompt, SCATTERED_TABLE)))
        torch.testing.assert_close(engine.last_logits[1], hf_logits(hf, tokens)[-1:], atol=ATOL, rtol=0)
        tokens.append(new[1])
