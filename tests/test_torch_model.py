"""The engine's model against transformers: same weights, same logits, same greedy tokens."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from backends.torch.factory import build_engine  # noqa: E402
from simcore.errors import ServesimError  # noqa: E402
from tests.test_torch_support import (  # noqa: E402
    ATOL,
    CPU,
    LLAMA3_SCALING,
    check_chunks_then_decodes,
    engine_for,
    hf_generate,
    hf_logits,
    hf_model,
    prompt_of,
    seq,
    step,
    tiny_spec,
)

VARIANTS = {
    "gqa-llama3-untied": dict(kv_heads=2, rope_scaling=LLAMA3_SCALING),
    "mha-tied": dict(kv_heads=4, tied=True),
    "mqa-llama3-tied": dict(kv_heads=1, tied=True, rope_scaling=LLAMA3_SCALING),
    "qwen2-bias": dict(kv_heads=2, bias=True),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request):
    spec = tiny_spec(**VARIANTS[request.param])
    hf = hf_model(spec)
    return spec, hf


def test_prefill_logits_match_transformers(pair):
    spec, hf = pair
    engine = engine_for(spec, hf=hf)
    engine.keep_logits = "all"
    prompt = prompt_of(37)
    engine.execute(step(seq(1, 37, 0, prompt, range(10))))
    torch.testing.assert_close(engine.last_logits[1], hf_logits(hf, prompt), atol=ATOL, rtol=0)


def test_chunked_prefill_and_decode_logits_match_transformers(pair):
    spec, hf = pair
    engine = engine_for(spec, hf=hf)
    engine.keep_logits = "all"
    # decodes: each step's logits against a full recomputation by transformers
    check_chunks_then_decodes(engine, hf, prompt_of(37, offset=11), num_decodes=6)


def test_greedy_tokens_equal_generate(pair):
    spec, hf = pair
    engine = engine_for(spec, hf=hf)
    prompts = {1: prompt_of(13, offset=5), 2: prompt_of(29, offset=50)}
    tables = {1: [0, 1, 2, 3, 4, 5, 6], 2: [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]}
    num_new = 8
    engine.execute(step(*(seq(r, len(p), 0, p, tables[r]) for r, p in prompts.items())))
    for k in range(num_new - 1):  # both requests decode in the same batch
        engine.execute(step(*(seq(r, 1, len(p) + k, p, tables[r]) for r, p in prompts.items())))
    for rid, prompt in prompts.items():
        assert engine.output_token_ids(rid) == hf_generate(hf, prompt, num_new)


def _write_sharded(hf, directory, spec) -> None:
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(directory / file))
        weight_map.update(dict.fromkeys(keys, file))
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    hf.config.save_pretrained(directory)


def test_loads_sharded_safetensors_checkpoint(tmp_path):
    spec = tiny_spec(rope_scaling=LLAMA3_SCALING)
    hf = hf_model(spec, seed=3)
    _write_sharded(hf, tmp_path, spec)
    engine = build_engine(spec, device=CPU, dtype=torch.float32, num_blocks=16, block_size=4, weights=tmp_path,
                          attention="portable")
    engine.keep_logits = "all"
    prompt = prompt_of(9)
    engine.execute(step(seq(1, 9, 0, prompt, range(3))))
    torch.testing.assert_close(engine.last_logits[1], hf_logits(hf, prompt), atol=ATOL, rtol=0)


def test_checkpoint_of_other_geometry_is_refused(tmp_path):
    hf = hf_model(tiny_spec(kv_heads=4))
    _write_sharded(hf, tmp_path, None)
    with pytest.raises(ServesimError, match="num_key_value_heads"):
        build_engine(tiny_spec(kv_heads=2), device=CPU, dtype=torch.float32, num_blocks=4, block_size=4,
                     weights=tmp_path)
    (tmp_path / "config.json").unlink()  # without config.json the tensor shapes still catch it
    with pytest.raises(ServesimError, match="shape"):
        build_engine(tiny_spec(kv_heads=2), device=CPU, dtype=torch.float32, num_blocks=4, block_size=4,
                     weights=tmp_path)


def test_checkpoint_missing_tensors_is_refused(tmp_path):
    from safetensors.torch import save_file

    hf = hf_model(tiny_spec())
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if "layers.1.mlp.up_proj" not in k}
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ServesimError, match="does not fill"):
        build_engine(tiny_spec(), device=CPU, dtype=torch.float32, num_blocks=4, block_size=4, weights=tmp_path)


def test_sliced_projection_equals_one_linear():
    # Small batches on the CPU run wide projections in slices of output features (a speed choice).
    from torch.nn import functional as F

    from backends.torch.model import CPU_OUTPUT_SLICE, project

    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(2 * CPU_OUTPUT_SLICE + 37, 48, generator=gen)
    bias = torch.randn(weight.shape[0], generator=gen)
    x = torch.randn(5, 48, generator=gen)
    torch.testing.assert_close(project(x, weight), F.linear(x, weight), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(project(x, weight, bias), F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)


def test_masked_attention_with_repeated_kv_heads_equals_grouped_query_attention():
    # CUDA prompt pieces repeat K/V heads so that the memory-efficient kernel (no grouped heads in
    # torch 2.11), not the math kernel, takes a masked call: it must be the same attention.
    from backends.torch.attention import masked_attention, repeat_heads

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 5, 16, generator=gen)
    keys, values = torch.randn(2, 2, 9, 16, generator=gen), torch.randn(2, 2, 9, 16, generator=gen)
    mask = torch.arange(9)[None, None, None, :] <= (torch.arange(5) + 4)[None, None, :, None]
    mask = mask.expand(2, 1, 5, 9).clone()
    mask[1, :, :, :2] = False  # a second piece that sees fewer keys
    grouped = masked_attention(q, keys, values, mask, 0.25)
    repeated = masked_attention(q, keys, values, mask, 0.25, repeat_kv=True)
    torch.testing.assert_close(repeated, grouped)
    assert repeat_heads(keys, 4)[:, 5].equal(keys[:, 1])  # query head 5 reads KV head 5 // 4


def test_eager_forwards_on_cuda_exclude_cudnn_attention():
    from backends.torch.attention import sdpa_backends

    before = torch.backends.cuda.cudnn_sdp_enabled()
    with sdpa_backends(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with sdpa_backends(torch.device("cuda"), allow_cudnn=True):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with sdpa_backends(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
