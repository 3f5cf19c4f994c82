"""Presets carry the public geometry and datasheet numbers; look-ups fail with a hint."""

from __future__ import annotations

import dataclasses
import json

import pytest

from simcore.errors import ConfigError
from simcore.model import kv_cache_gib
from simcore.presets import (
    HardwareSpec,
    LinkSpec,
    get_hardware,
    get_link,
    get_model,
    hardware_names,
    link_names,
    model_names,
)


def test_all_requested_presets_exist():
    assert {"llama-3.1-8b", "llama-3.2-1b", "llama-2-7b", "mistral-7b", "qwen2.5-7b", "llama-3.1-70b",
            "tiny-llama"} <= set(model_names())
    assert {"a100-80gb", "h100-sxm", "h200", "l4", "cpu"} <= set(hardware_names())
    assert {"pcie-gen4-pinned", "pcie-gen4-pageable", "pcie-gen5-pinned", "pcie-gen5-pageable",
            "h200-host-pinned", "h200-host-pageable"} <= set(link_names())


@pytest.mark.parametrize(
    ("name", "geometry", "billions"),
    [
        # (layers, hidden, H_Q, H_KV, d_h, intermediate, vocab), published parameter count
        ("llama-3.1-8b", (32, 4096, 32, 8, 128, 14336, 128256), 8.03),
        ("llama-3.2-1b", (16, 2048, 32, 8, 64, 8192, 128256), 1.236),
        ("llama-2-7b", (32, 4096, 32, 32, 128, 11008, 32000), 6.74),
        ("mistral-7b", (32, 4096, 32, 8, 128, 14336, 32000), 7.24),
        ("qwen2.5-7b", (28, 3584, 28, 4, 128, 18944, 152064), 7.62),
        ("llama-3.1-70b", (80, 8192, 64, 8, 128, 28672, 128256), 70.55),
        ("tiny-llama", (2, 64, 4, 2, 16, 128, 256), 0.000106816),
    ],
)
def test_model_geometry_matches_public_configs(name, geometry, billions):
    m = get_model(name)
    assert m.name == name
    assert (m.num_layers, m.hidden_size, m.num_q_heads, m.num_kv_heads, m.head_dim, m.intermediate_size,
            m.vocab_size) == geometry
    assert m.num_params / 1e9 == pytest.approx(billions, rel=2e-3)


def test_rope_and_flags_as_config_json_spells_them():
    llama31 = get_model("llama-3.1-8b")
    assert llama31.rope_theta == 500000.0
    assert llama31.rope_scaling == {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    assert get_model("llama-3.1-70b").rope_scaling == llama31.rope_scaling
    assert get_model("llama-3.1-70b").rope_scaling is not llama31.rope_scaling  # no shared mutable state
    llama32 = get_model("llama-3.2-1b")
    assert llama32.rope_scaling["factor"] == 32.0 and llama32.tie_word_embeddings
    assert get_model("llama-2-7b").rope_scaling is None
    assert get_model("mistral-7b").max_position_embeddings == 32768
    qwen = get_model("qwen2.5-7b")
    assert qwen.attention_bias and qwen.rope_theta == 1e6 and qwen.rms_norm_eps == 1e-6
    assert not get_model("llama-3.1-8b").attention_bias


def test_llama31_8b_kv_matches_the_seed_example():
    m = get_model("llama-3.1-8b")
    gib = kv_cache_gib(layers=m.num_layers, batch=1, kv_heads=m.num_kv_heads, seq_len=8192, head_dim=m.head_dim)
    assert gib == 1.0


def test_hardware_datasheet_numbers():
    h200 = get_hardware("h200")
    # Memory as the devices report it (nvidia-smi's total, MiB), not the datasheets' decimal GB.
    assert (h200.peak_flops, h200.mem_bandwidth, h200.memory_bytes) == (989e12, 4.8e12, 143771 * 2**20)
    assert get_hardware("h100-sxm").mem_bandwidth == 3.35e12
    assert get_hardware("a100-80gb").peak_flops == 312e12
    assert get_hardware("a100-80gb").memory_bytes == 80 * 2**30
    l4 = get_hardware("l4")
    assert (l4.peak_flops, l4.mem_bandwidth, l4.memory_bytes) == (121e12, 0.3e12, 23034 * 2**20)
    for name in hardware_names():
        hw = get_hardware(name)
        assert hw.interconnect_bandwidth > 0 and hw.interconnect_latency_s >= 0
        assert hw.host_link in link_names()


def test_link_presets():
    assert get_link("h200-host-pinned").bytes_per_s == 55e9
    assert get_link("h200-host-pageable").bytes_per_s == 21e9
    assert get_link("pcie-gen4-pinned").bytes_per_s == 25e9
    assert get_link("pcie-gen4-pageable").bytes_per_s == 12e9
    assert get_link("pcie-gen5-pinned").bytes_per_s > get_link("pcie-gen4-pinned").bytes_per_s
    assert get_link("pcie-gen4").bytes_per_s == get_link("pcie-gen4-pinned").bytes_per_s
    assert get_hardware("h200").host_link == "h200-host-pinned"


def test_specs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_hardware("h200").peak_flops = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_link("pcie-gen4-pinned").latency_s = 0.0
    assert isinstance(get_hardware("cpu"), HardwareSpec) and isinstance(get_link("pcie-gen5"), LinkSpec)


@pytest.mark.parametrize(
    ("lookup", "typo", "hint"),
    [(get_model, "lama-3.1-8b", "llama-3.1-8b"), (get_hardware, "h100-sx", "h100-sxm"),
     (get_link, "pcie-gen4-pined", "pcie-gen4-pinned")],
)
def test_unknown_names_suggest_a_close_one(lookup, typo, hint):
    with pytest.raises(ConfigError) as err:
        lookup(typo, source="exp.yaml")
    text = str(err.value)
    assert "exp.yaml" in text and repr(typo) in text and f"did you mean {hint!r}" in text


def _write_config(folder, **overrides):
    raw = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
    raw.update(overrides)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder / "config.json"


def test_get_model_reads_a_config_file_or_folder(tmp_path):
    path = _write_config(tmp_path / "my-model")
    by_file = get_model(str(path))
    by_dir = get_model(str(path.parent))
    assert by_file == by_dir
    assert by_file.name == "my-model" and by_file.head_dim == 16


def test_relative_config_path_resolves_next_to_the_naming_file(tmp_path):
    _write_config(tmp_path / "models" / "m")
    experiment = tmp_path / "exp.yaml"
    experiment.write_text("{}")
    assert get_model("models/m", source=experiment).num_layers == 2
    _write_config(tmp_path / "plainname")
    assert get_model("plainname", source=experiment).name == "plainname"


def test_missing_config_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such model config file"):
        get_model(str(tmp_path / "nowhere" / "config.json"))


def test_tiny_llama_parameter_count_matches_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    m = get_model("tiny-llama")
    config = transformers.LlamaConfig(
        num_hidden_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_q_heads,
        num_key_value_heads=m.num_kv_heads, head_dim=m.head_dim, intermediate_size=m.intermediate_size,
        vocab_size=m.vocab_size, tie_word_embeddings=m.tie_word_embeddings,
        max_position_embeddings=m.max_position_embeddings,
    )
    with torch.device("meta"):
        hf_model = transformers.LlamaForCausalLM(config)
    assert sum(p.numel() for p in hf_model.parameters()) == m.num_params


# Presets added for models served widely today, each from its config.json as NVIDIA's
# aiconfigurator keeps a copy (ai-dynamo/aiconfigurator at 095f58a5,
# aic-core/src/aiconfigurator_core/model_configs/<org>--<model>_config.json), keys as published
# (those the loader reads, and a few it ignores).
# The dense Qwen3 models' config.json keys they share.
_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 40960, "model_type": "qwen3", "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "use_sliding_window": False, "vocab_size": 151936,
}
SERVED_CONFIGS = {
    "llama-3.1-405b": {  # meta-llama/Meta-Llama-3.1-405B
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu", "hidden_size": 16384,
        "intermediate_size": 53248, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 128, "num_hidden_layers": 126, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256,
    },
    "qwen3-8b": {**_QWEN3, "hidden_size": 4096, "intermediate_size": 12288,  # Qwen/Qwen3-8B
                 "num_attention_heads": 32, "num_hidden_layers": 36},
    "qwen3-32b": {**_QWEN3, "hidden_size": 5120, "intermediate_size": 25600,  # Qwen/Qwen3-32B
                  "num_attention_heads": 64, "num_hidden_layers": 64},
    "mixtral-8x22b": {  # mistralai/Mixtral-8x22B-v0.1
        "architectures": ["MixtralForCausalLM"], "hidden_act": "silu", "hidden_size": 6144, "intermediate_size": 16384,
        "max_position_embeddings": 65536, "model_type": "mixtral", "num_attention_heads": 48, "num_experts_per_tok": 2,
        "num_hidden_layers": 56, "num_key_value_heads": 8, "num_local_experts": 8, "rms_norm_eps": 1e-05,
        "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 32000,
    },
    "qwen3-235b-a22b": {  # Qwen/Qwen3-235B-A22B
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "decoder_sparse_step": 1, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 40960,
        "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 1536, "num_attention_heads": 64,
        "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 94, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None,
        "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936,
    },
    "deepseek-r1": {  # deepseek-ai/DeepSeek-R1
        "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "first_k_dense_replace": 3,
        "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
        "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
        "moe_layer_freq": 1, "n_routed_experts": 256, "n_shared_experts": 1, "num_attention_heads": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128, "q_lora_rank": 1536,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "tie_word_embeddings": False, "v_head_dim": 128, "vocab_size": 129280,
    },
}


@pytest.mark.parametrize("name", sorted(SERVED_CONFIGS))
def test_served_model_presets_are_their_config_json(tmp_path, name):
    from simcore.hf_config import load_hf_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps(SERVED_CONFIGS[name]))
    preset = get_model(name)
    assert dataclasses.replace(load_hf_config(path), name=name) == preset
    assert preset.rope_scaling is not get_model("deepseek-v3").rope_scaling  # no shared mutable state


@pytest.mark.parametrize(("name", "total", "active"), [
    # The model cards' counts, in billions (as rounded there).
    ("llama-3.1-405b", 405, 405),
    ("qwen3-8b", 8.2, 8.2),
    ("qwen3-32b", 32.8, 32.8),
    ("mixtral-8x22b", 141, 39),  # Mistral AI: 141B total, 39B active
    ("qwen3-235b-a22b", 235, 22),  # Qwen3 card: 235B total, 22B activated
    ("deepseek-r1", 671, 37),  # as DeepSeek-V3 (the multi-token-prediction layer not counted)
])
def test_served_model_parameters_match_their_cards(name, total, active):
    model = get_model(name)
    assert model.num_params / 1e9 == pytest.approx(total, rel=0.01)
    assert model.num_active_params / 1e9 == pytest.approx(active, rel=0.025)
