"""Hugging Face config.json -> ModelSpec, and clear errors for bad files."""

from __future__ import annotations

import dataclasses
import json

import pytest

from simcore.errors import ConfigError
from simcore.hf_config import context_length, load_hf_config, model_from_hf_dict
from simcore.presets import get_model


def _as_config_json(name: str) -> dict:
    """A preset written back out with config.json's key names (transformers 4.x spelling)."""
    m = get_model(name)
    arch = {"qwen2.5-7b": "Qwen2ForCausalLM", "mistral-7b": "MistralForCausalLM"}.get(name, "LlamaForCausalLM")
    raw = {
        "architectures": [arch], "num_hidden_layers": m.num_layers, "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_q_heads, "num_key_value_heads": m.num_kv_heads,
        "intermediate_size": m.intermediate_size, "vocab_size": m.vocab_size,
        "tie_word_embeddings": m.tie_word_embeddings, "rope_theta": m.rope_theta, "rope_scaling": m.rope_scaling,
        "max_position_embeddings": m.max_position_embeddings, "rms_norm_eps": m.rms_norm_eps,
        "hidden_act": "silu", "torch_dtype": "bfloat16",
    }
    if m.head_dim != m.hidden_size // m.num_q_heads:
        raw["head_dim"] = m.head_dim
    if arch == "LlamaForCausalLM":
        raw["attention_bias"] = m.attention_bias
    if arch == "MistralForCausalLM":
        # The preset has no window; absent, transformers' MistralConfig would default to 4096.
        raw["sliding_window"] = None
    return raw


def _write(tmp_path, raw, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(raw, indent=2) if not isinstance(raw, str) else raw)
    return path


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.2-1b", "llama-2-7b", "mistral-7b", "qwen2.5-7b",
                                  "llama-3.1-70b", "tiny-llama"])
def test_presets_round_trip_through_config_json(tmp_path, name):
    parsed = load_hf_config(_write(tmp_path, _as_config_json(name)))
    assert dataclasses.replace(parsed, name=name) == get_model(name)
    assert parsed.rope_scaling == get_model(name).rope_scaling


def test_defaults_follow_transformers(tmp_path):
    raw = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 256, "head_dim": None, "num_key_value_heads": None}
    m = model_from_hf_dict(raw)
    assert m.num_kv_heads == 4  # absent (or null) H_KV means multi-head attention
    assert m.head_dim == 16  # hidden / heads
    assert (m.rope_theta, m.rope_scaling, m.tie_word_embeddings, m.attention_bias) == (10000.0, None, False, False)
    assert m.max_position_embeddings == 2048 and m.rms_norm_eps == 1e-6


def test_qwen2_has_a_qkv_bias_even_when_config_json_is_silent():
    raw = _as_config_json("qwen2.5-7b")
    assert "attention_bias" not in raw
    assert model_from_hf_dict(raw).attention_bias
    assert model_from_hf_dict({**raw, "architectures": None, "model_type": "qwen2"}).attention_bias


def test_transformers_5_rope_parameters_spelling():
    raw = _as_config_json("llama-3.1-8b")
    scaling = raw.pop("rope_scaling")
    raw.pop("rope_theta")
    raw["rope_parameters"] = {**scaling, "rope_theta": 500000.0}
    m = model_from_hf_dict(raw)
    assert m.rope_theta == 500000.0 and m.rope_scaling == scaling
    plain = model_from_hf_dict({**raw, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}})
    assert plain.rope_theta == 1e6 and plain.rope_scaling is None


def test_config_written_by_installed_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        num_hidden_layers=3, hidden_size=96, num_attention_heads=6, num_key_value_heads=2, intermediate_size=256,
        vocab_size=1000, max_position_embeddings=16384, rope_theta=500000.0,
        rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    )
    config.save_pretrained(tmp_path / "saved")
    m = load_hf_config(tmp_path / "saved")
    assert (m.num_layers, m.hidden_size, m.num_q_heads, m.num_kv_heads, m.head_dim) == (3, 96, 6, 2, 16)
    assert m.rope_theta == 500000.0 and m.rope_scaling["rope_type"] == "llama3"
    assert m.name == "saved"


def test_invalid_json_names_file_and_line(tmp_path):
    path = _write(tmp_path, '{\n  "hidden_size": 64,\n  "vocab_size": ,\n}')
    with pytest.raises(ConfigError) as err:
        load_hf_config(path)
    assert str(path) in str(err.value) and "line 3" in str(err.value)


def test_top_level_must_be_an_object(tmp_path):
    with pytest.raises(ConfigError, match="JSON object"):
        load_hf_config(_write(tmp_path, "[1, 2]"))


def test_missing_key_names_file_and_key(tmp_path):
    raw = _as_config_json("tiny-llama")
    del raw["intermediate_size"]
    path = _write(tmp_path, raw)
    with pytest.raises(ConfigError) as err:
        load_hf_config(path)
    assert str(path) in str(err.value) and "intermediate_size" in str(err.value) and "missing" in str(err.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [("num_hidden_layers", "32"), ("num_hidden_layers", True), ("hidden_size", 64.0), ("vocab_size", -1),
     ("rope_theta", "big"), ("rope_scaling", [1, 2]), ("tie_word_embeddings", "no"), ("rms_norm_eps", 0),
     ("architectures", "LlamaForCausalLM")],
)
def test_ill_typed_values_name_the_key(tmp_path, key, value):
    path = _write(tmp_path, {**_as_config_json("tiny-llama"), key: value})
    with pytest.raises(ConfigError) as err:
        load_hf_config(path)
    assert str(path) in str(err.value) and key in str(err.value)


def test_heads_must_divide_into_kv_groups(tmp_path):
    path = _write(tmp_path, {**_as_config_json("tiny-llama"), "num_attention_heads": 6, "num_key_value_heads": 4})
    with pytest.raises(ConfigError, match="not divisible by num_key_value_heads"):
        load_hf_config(path)


def test_hidden_must_split_over_heads_without_head_dim():
    raw = {**_as_config_json("tiny-llama"), "hidden_size": 66}
    with pytest.raises(ConfigError, match="head_dim"):
        model_from_hf_dict(raw)
    assert model_from_hf_dict({**raw, "head_dim": 16}).head_dim == 16


def test_unsupported_architecture_suggests_a_spelling():
    raw = {**_as_config_json("tiny-llama"), "architectures": ["LlamaForCausalLm"]}
    with pytest.raises(ConfigError, match="did you mean 'LlamaForCausalLM'"):
        model_from_hf_dict(raw)
    with pytest.raises(ConfigError, match="unsupported model_type"):
        model_from_hf_dict({**raw, "architectures": None, "model_type": "gpt2"})


@pytest.mark.parametrize(("key", "value"), [("hidden_act", "gelu"), ("mlp_bias", True)])
def test_layers_modelspec_cannot_describe_are_rejected(key, value):
    with pytest.raises(ConfigError, match=key):
        model_from_hf_dict({**_as_config_json("tiny-llama"), key: value})


def test_folder_without_config_json(tmp_path):
    with pytest.raises(ConfigError, match="no such model config file"):
        load_hf_config(tmp_path)


def _tiny(arch: str, **extra) -> dict:
    return {"architectures": [arch], "num_hidden_layers": 12, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 128, **extra}


def test_gemma2_defaults_follow_transformers():
    m = model_from_hf_dict(_tiny("Gemma2ForCausalLM"))
    assert m.sliding_window == 4096 and m.sliding_layers == tuple(range(0, 12, 2))  # every other, from layer 0
    assert (m.attn_logit_softcapping, m.final_logit_softcapping, m.query_pre_attn_scalar) == (50.0, 30.0, 256.0)
    assert m.head_dim == 256 and m.tie_word_embeddings and m.sandwich_norms and m.norm_weight_offset == 1.0
    assert m.hidden_act == "gelu_pytorch_tanh" and m.embedding_scale == 8.0 and m.attention_scale == 256**-0.5
    capped = model_from_hf_dict(_tiny("Gemma2ForCausalLM", final_logit_softcapping=None, sliding_window=16))
    assert capped.final_logit_softcapping is None and capped.sliding_window == 16


def test_gemma3_pattern_and_local_rope_in_both_spellings():
    old = model_from_hf_dict(_tiny("Gemma3ForCausalLM", rope_local_base_freq=20000.0,
                                   rope_scaling={"rope_type": "linear", "factor": 8.0}))
    assert old.sliding_layers == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10)  # layers 5 and 11 are global
    assert (old.rope_theta, old.rope_local_theta, old.rope_scaling["factor"]) == (1e6, 20000.0, 8.0)
    assert old.qk_norm and old.final_logit_softcapping is None
    assert context_length(old) == 131072  # already scaled, as vLLM reads Gemma 3
    new = model_from_hf_dict(_tiny("Gemma3ForCausalLM", rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}))
    assert (new.rope_theta, new.rope_local_theta, new.rope_scaling) == (1e6, 20000.0, {"rope_type": "linear",
                                                                                      "factor": 8.0})


def test_qwen3_mistral_and_phi3_windows():
    qwen3 = model_from_hf_dict(_tiny("Qwen3ForCausalLM", sliding_window=64))
    assert qwen3.qk_norm and qwen3.head_dim == 128 and qwen3.num_sliding_layers == 0  # use_sliding_window off
    qwen3 = model_from_hf_dict(_tiny("Qwen3ForCausalLM", head_dim=16, use_sliding_window=True, sliding_window=64,
                                     max_window_layers=10))
    assert qwen3.sliding_layers == (10, 11) and qwen3.sliding_window == 64
    assert model_from_hf_dict(_tiny("MistralForCausalLM")).num_sliding_layers == 12  # absent: 4096
    assert model_from_hf_dict(_tiny("MistralForCausalLM", sliding_window=None)).sliding_window is None
    phi3 = model_from_hf_dict(_tiny("Phi3ForCausalLM", sliding_window=2047))
    assert phi3.sliding_window == 2047 and phi3.num_sliding_layers == 12 and phi3.rms_norm_eps == 1e-5
    assert model_from_hf_dict(_tiny("Phi3ForCausalLM")).sliding_window is None
    layer_types = ["full_attention"] * 11 + ["sliding_attention"]
    given = model_from_hf_dict(_tiny("Qwen3ForCausalLM", use_sliding_window=True, layer_types=layer_types))
    assert given.sliding_layers == (11,)


def test_sliding_layers_cap_the_kv_a_request_needs():
    m = model_from_hf_dict(_tiny("Gemma2ForCausalLM", head_dim=16, sliding_window=8))
    per_position = 2 * 2 * 16 * 2  # K and V x H_KV x d x bf16, per layer
    assert m.kv_bytes_needed(5) == 12 * 5 * per_position  # inside the window: every layer
    assert m.kv_bytes_needed(100) == (6 * 100 + 6 * 8) * per_position
    assert m.kv_bytes_per_token(2) == 12 * per_position  # what a pool keeping every layer allocates
    llama = get_model("llama-3.1-8b")
    assert llama.kv_bytes_needed(1000) == 1000 * llama.kv_bytes_per_token(2)


@pytest.mark.parametrize(("arch", "key", "value"), [
    ("Gemma2ForCausalLM", "hidden_activation", "relu"),
    ("Gemma2ForCausalLM", "use_bidirectional_attention", True),
    ("Gemma3ForCausalLM", "attention_bias", True),
    ("Phi3ForCausalLM", "partial_rotary_factor", 0.5),
    ("Qwen3ForCausalLM", "layer_types", ["full_attention"]),
    ("Qwen3ForCausalLM", "hidden_act", "gelu"),
])
def test_family_features_modelspec_cannot_describe_are_rejected(arch, key, value):
    with pytest.raises(ConfigError, match=key):
        model_from_hf_dict(_tiny(arch, use_sliding_window=True, **{key: value}))
