"""Named models, accelerators and host links, with the public numbers they come from.

Model geometry is copied from each model's Hugging Face `config.json` (keys spelt as there).
A model's context length, the default max_model_len, is derived from max_position_embeddings
and rope_scaling as vLLM does (simcore.hf_config.context_length); each entry notes its value.
Accelerators and links are in simcore/hardware.yaml, a source beside every number: dense
(no sparsity) tensor-core peaks per dtype, HBM bandwidth, interconnect and host link, and memory
as the device reports it (nvidia-smi's total: an H200 reports 143771 MiB, not 141e9 bytes).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from simcore.errors import ConfigError
from simcore.hardware import GB, HardwareSpec, LinkSpec, hardware_from_mapping, load_links, load_presets  # noqa: F401 - GB re-exported
from simcore.model import ModelSpec
from simcore.paths import expand_home

# Llama 3.1 / 3.2 long-context RoPE scaling, spelt as in their config.json files.
_LLAMA31_ROPE_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
_LLAMA32_ROPE_SCALING = {**_LLAMA31_ROPE_SCALING, "factor": 32.0}
# (Each preset gets its own copy below: the dicts are mutable and must not be shared.)

def _gpt_oss(name: str, *, num_layers: int, num_experts: int) -> ModelSpec:
    """A gpt-oss model: the two sizes differ only in depth and experts (their config.json files)."""
    return ModelSpec(
        name=name, num_layers=num_layers, hidden_size=2880, num_q_heads=64, num_kv_heads=8,
        head_dim=64, intermediate_size=2880, vocab_size=201088, tie_word_embeddings=False,
        rope_theta=150000.0, rope_scaling={"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                           "original_max_position_embeddings": 4096, "rope_type": "yarn",
                                           "truncate": False},
        max_position_embeddings=131072, rms_norm_eps=1e-5, attention_bias=True,
        sliding_window=128, sliding_layers=tuple(range(0, num_layers, 2)),
        num_experts=num_experts, num_experts_per_tok=4, moe_bias=True, attention_sinks=True,
        # config.json quantization_config: quant_method mxfp4, modules_to_not_convert the attention,
        # router, embeddings and lm_head (bf16): only the routed experts are MXFP4.
        expert_weight_dtype="mxfp4",
    )


# deepseek-ai/DeepSeek-V3 config.json: MLA (kv_lora_rank 512, q_lora_rank 1536, per-head q.k
# width 128 + 64, v 128), 256 routed experts of 2048 plus 1 shared, top-8, the first 3 layers
# dense (first_k_dense_replace). The multi-token-prediction layer (num_nextn_predict_layers,
# 14B more) is not counted: vLLM loads it only for speculative decoding. Context 163840
# (yarn, 40 x 4096).
_DEEPSEEK_V3 = ModelSpec(
    name="deepseek-v3", num_layers=61, hidden_size=7168, num_q_heads=128, num_kv_heads=128,
    head_dim=192, intermediate_size=18432, vocab_size=129280, tie_word_embeddings=False,
    rope_theta=10000.0, rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                      "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                      "type": "yarn"},
    max_position_embeddings=163840, rms_norm_eps=1e-6,
    num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048, num_shared_experts=1,
    dense_mlp_layers=(0, 1, 2), kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
    qk_nope_head_dim=128, v_head_dim=128,
)


MODELS: dict[str, ModelSpec] = {
    # meta-llama/Llama-3.1-8B config.json. Context 131072: max_position_embeddings already gives
    # the extended length (llama3 RoPE scaling, 8x the original 8192).
    "llama-3.1-8b": ModelSpec(
        name="llama-3.1-8b", num_layers=32, hidden_size=4096, num_q_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
        rope_theta=500000.0, rope_scaling=dict(_LLAMA31_ROPE_SCALING), max_position_embeddings=131072,
        rms_norm_eps=1e-5,
    ),
    # meta-llama/Llama-3.2-1B config.json: explicit head_dim 64, tied embeddings. Context 131072
    # (llama3 RoPE scaling, already in max_position_embeddings).
    "llama-3.2-1b": ModelSpec(
        name="llama-3.2-1b", num_layers=16, hidden_size=2048, num_q_heads=32, num_kv_heads=8,
        head_dim=64, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
        rope_theta=500000.0, rope_scaling=dict(_LLAMA32_ROPE_SCALING), max_position_embeddings=131072,
        rms_norm_eps=1e-5,
    ),
    # meta-llama/Llama-2-7b-hf config.json: multi-head attention (H_KV = H_Q). Context 4096.
    "llama-2-7b": ModelSpec(
        name="llama-2-7b", num_layers=32, hidden_size=4096, num_q_heads=32, num_kv_heads=32,
        head_dim=128, intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False,
        rope_theta=10000.0, max_position_embeddings=4096, rms_norm_eps=1e-5,
    ),
    # mistralai/Mistral-7B-v0.1 config.json. Its sliding_window (4096) is ignored: the
    # simulator keeps and attends to the whole context, so long contexts are over-priced. Context
    # 32768 (max_position_embeddings; vLLM does not shorten it to the window either).
    "mistral-7b": ModelSpec(
        name="mistral-7b", num_layers=32, hidden_size=4096, num_q_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=32000, tie_word_embeddings=False,
        rope_theta=10000.0, max_position_embeddings=32768, rms_norm_eps=1e-5,
    ),
    # Qwen/Qwen2.5-7B config.json (base model); Qwen2 puts a bias on q/k/v. Context 131072 (the
    # Instruct model's config.json says 32768, reaching 131072 only with YaRN added).
    "qwen2.5-7b": ModelSpec(
        name="qwen2.5-7b", num_layers=28, hidden_size=3584, num_q_heads=28, num_kv_heads=4,
        head_dim=128, intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False,
        rope_theta=1000000.0, max_position_embeddings=131072, rms_norm_eps=1e-6,
        attention_bias=True,
    ),
    # meta-llama/Llama-3.1-70B config.json. Context 131072, as Llama-3.1-8B.
    "llama-3.1-70b": ModelSpec(
        name="llama-3.1-70b", num_layers=80, hidden_size=8192, num_q_heads=64, num_kv_heads=8,
        head_dim=128, intermediate_size=28672, vocab_size=128256, tie_word_embeddings=False,
        rope_theta=500000.0, rope_scaling=dict(_LLAMA31_ROPE_SCALING), max_position_embeddings=131072,
        rms_norm_eps=1e-5,
    ),
    # meta-llama/Llama-3.1-405B config.json (as NVIDIA aiconfigurator keeps it, model_configs/
    # meta-llama--Meta-Llama-3.1-405B_config.json at 095f58a5). Context 131072, as Llama-3.1-8B.
    "llama-3.1-405b": ModelSpec(
        name="llama-3.1-405b", num_layers=126, hidden_size=16384, num_q_heads=128, num_kv_heads=8,
        head_dim=128, intermediate_size=53248, vocab_size=128256, tie_word_embeddings=False,
        rope_theta=500000.0, rope_scaling=dict(_LLAMA31_ROPE_SCALING), max_position_embeddings=131072,
        rms_norm_eps=1e-5,
    ),
    # Qwen/Qwen3-8B and Qwen/Qwen3-32B config.json (aiconfigurator's copies, as above): explicit
    # head_dim 128, q/k norms, no q/k/v bias. Context 40960.
    "qwen3-8b": ModelSpec(
        name="qwen3-8b", num_layers=36, hidden_size=4096, num_q_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False,
        rope_theta=1000000.0, max_position_embeddings=40960, rms_norm_eps=1e-6, qk_norm=True,
    ),
    "qwen3-32b": ModelSpec(
        name="qwen3-32b", num_layers=64, hidden_size=5120, num_q_heads=64, num_kv_heads=8,
        head_dim=128, intermediate_size=25600, vocab_size=151936, tie_word_embeddings=False,
        rope_theta=1000000.0, max_position_embeddings=40960, rms_norm_eps=1e-6, qk_norm=True,
    ),
    # --- Mixture-of-experts and latent-attention models: the roofline prices them; the real
    # engine (backends/torch) refuses them. Total/active parameters are checked against the
    # model cards in tests/test_moe_mla.py.
    # mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts, top-2, each as wide as the dense MLP;
    # sliding_window null. Context 32768.
    "mixtral-8x7b": ModelSpec(
        name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_q_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=32000, tie_word_embeddings=False,
        rope_theta=1000000.0, max_position_embeddings=32768, rms_norm_eps=1e-5,
        num_experts=8, num_experts_per_tok=2,
    ),
    # mistralai/Mixtral-8x22B-v0.1 config.json (aiconfigurator's copy, as above): 8 experts of
    # 16384, top-2; sliding_window null. Context 65536.
    "mixtral-8x22b": ModelSpec(
        name="mixtral-8x22b", num_layers=56, hidden_size=6144, num_q_heads=48, num_kv_heads=8,
        head_dim=128, intermediate_size=16384, vocab_size=32000, tie_word_embeddings=False,
        rope_theta=1000000.0, max_position_embeddings=65536, rms_norm_eps=1e-5,
        num_experts=8, num_experts_per_tok=2,
    ),
    # Qwen/Qwen3-235B-A22B config.json (aiconfigurator's copy, as above): 128 experts of 1536,
    # top-8, no shared expert, every layer sparse; q/k norms. Context 40960.
    "qwen3-235b-a22b": ModelSpec(
        name="qwen3-235b-a22b", num_layers=94, hidden_size=4096, num_q_heads=64, num_kv_heads=4,
        head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False,
        rope_theta=1000000.0, max_position_embeddings=40960, rms_norm_eps=1e-6, qk_norm=True,
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536,
    ),
    # Qwen/Qwen3-30B-A3B config.json: 128 experts of 768, top-8, no shared expert, every layer
    # sparse (decoder_sparse_step 1, mlp_only_layers []); q/k norms as Qwen3. Context 40960.
    "qwen3-30b-a3b": ModelSpec(
        name="qwen3-30b-a3b", num_layers=48, hidden_size=2048, num_q_heads=32, num_kv_heads=4,
        head_dim=128, intermediate_size=6144, vocab_size=151936, tie_word_embeddings=False,
        rope_theta=1000000.0, max_position_embeddings=40960, rms_norm_eps=1e-6, qk_norm=True,
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
    ),
    # DeepSeek-V3 (above, with what its config.json gives).
    "deepseek-v3": _DEEPSEEK_V3,
    # deepseek-ai/DeepSeek-R1 config.json: DeepSeek-V3's architecture, every key the simulator
    # reads the same (tests/test_moe_mla.py parses both).
    "deepseek-r1": dataclasses.replace(_DEEPSEEK_V3, name="deepseek-r1", rope_scaling=dict(_DEEPSEEK_V3.rope_scaling)),
    # openai/gpt-oss-20b config.json: 32 experts, top-4, biases on the router and experts, q/k/v/o
    # biases, a sink logit per head; layer_types alternate sliding (128 positions, even layers)
    # and full attention. Context 131072 (yarn, 32 x 4096).
    "gpt-oss-20b": _gpt_oss("gpt-oss-20b", num_layers=24, num_experts=32),
    # openai/gpt-oss-120b config.json: gpt-oss-20b with 36 layers and 128 experts.
    "gpt-oss-120b": _gpt_oss("gpt-oss-120b", num_layers=36, num_experts=128),
    # A made-up Llama small enough for CPU tests of the real engine (GQA with 2 groups); context 2048.
    "tiny-llama": ModelSpec(
        name="tiny-llama", num_layers=2, hidden_size=64, num_q_heads=4, num_kv_heads=2,
        head_dim=16, intermediate_size=128, vocab_size=256, tie_word_embeddings=False,
        rope_theta=10000.0, max_position_embeddings=2048, rms_norm_eps=1e-5,
    ),
}


# Accelerators and links come from simcore/hardware.yaml, a source for every number
# (simcore/hardware.py loads and checks it; `servesim hardware` lists them).
LINKS: dict[str, LinkSpec] = dict(load_links())
HARDWARE: dict[str, HardwareSpec] = dict(load_presets())


def model_names() -> list[str]:
    return sorted(MODELS)


def hardware_names() -> list[str]:
    return sorted(HARDWARE)


def link_names() -> list[str]:
    return sorted(LINKS)


def get_model(name_or_path: str, *, source: str | Path | None = None) -> ModelSpec:
    """A preset by name, or the geometry in a Hugging Face `config.json` (file or its directory).

    A relative path is taken relative to the folder of `source` (the file that names it) when
    `source` is given, else to the working directory.
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ConfigError("model must be a preset name or a config.json path", source=_text(source),
                          where="model", expected=f"one of {model_names()} or a path", found=name_or_path)
    if name_or_path in MODELS:
        return MODELS[name_or_path]
    path = _resolve(name_or_path, source)
    if _looks_like_path(name_or_path) or path.exists():
        from simcore.hf_config import load_hf_config

        return load_hf_config(path)
    raise ConfigError(
        "unknown model", source=_text(source), where="model",
        expected=f"one of {model_names()} or a path to a config.json", found=name_or_path, choices=MODELS,
    )


def get_hardware(name_or_mapping: str | dict | HardwareSpec, *, source: str | Path | None = None,
                 where: str = "hardware") -> HardwareSpec:
    """A preset by name, or hardware given as a mapping (simcore.hardware: every field checked,
    a bad one a ConfigError naming `source` and the field)."""
    if isinstance(name_or_mapping, HardwareSpec):
        return name_or_mapping
    if isinstance(name_or_mapping, dict):
        return hardware_from_mapping(name_or_mapping, source=_text(source), where=where, links=LINKS)
    if not isinstance(name_or_mapping, str) or name_or_mapping not in HARDWARE:
        # (A family name, h100, hints at one of its parts: simcore.errors.close_match.)
        raise ConfigError("unknown hardware", source=_text(source), where=where,
                          expected=f"one of {hardware_names()} or a mapping (docs/cost-models.md#hardware)",
                          found=name_or_mapping, choices=HARDWARE)
    return HARDWARE[name_or_mapping]


def get_link(name: str, *, source: str | Path | None = None, where: str = "link") -> LinkSpec:
    """A link preset by name (host links, interconnects, networks alike)."""
    if not isinstance(name, str) or name not in LINKS:
        raise ConfigError("unknown link", source=_text(source), where=where,
                          expected=f"one of {link_names()}", found=name, choices=LINKS)
    return LINKS[name]


def _looks_like_path(text: str) -> bool:
    return "/" in text or "\\" in text or text.endswith(".json")


def _resolve(text: str, source: str | Path | None) -> Path:
    path = expand_home(text)
    if not path.is_absolute() and source is not None and Path(source).is_file():
        path = Path(source).parent / path
    return path


def _text(source: str | Path | None) -> str | None:
    return str(source) if source is not None else None
