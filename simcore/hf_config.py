"""Reading a Hugging Face `config.json` into a ModelSpec.

Families: Llama, Mistral (with or without sliding_window), Qwen2 and Qwen3, Gemma 2, Gemma 3
(text-only checkpoints, `Gemma3ForCausalLM`) and Phi-3; and the mixture-of-experts families
Mixtral, Qwen3-MoE, DeepSeek-V2/V3 (with multi-head latent attention) and gpt-oss (sliding layers
and attention sinks), which the roofline prices and the real engine refuses. Key names and
defaults follow the transformers configuration classes of each family (LlamaConfig, MistralConfig,
Qwen2Config, Qwen3Config, Gemma2Config, Gemma3TextConfig, Phi3Config, MixtralConfig,
Qwen3MoeConfig, DeepseekV2Config, DeepseekV3Config, GptOssConfig), including which layers slide,
which layers are sparse and the defaults a config.json may leave out. Both spellings of RoPE
settings are accepted: `rope_theta` and `rope_scaling` (transformers 4.x) and a `rope_parameters`
mapping (transformers 5; per layer type for Gemma 3). `context_length` derives a model's context
(the default max_model_len) as vLLM does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from simcore.errors import ConfigError, close_match
from simcore.model import ModelSpec

# Architectures whose decoder layer ModelSpec describes, by config.json `architectures` entry
# and by `model_type` (same order).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                           "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "MixtralForCausalLM",
                           "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
                           "GptOssForCausalLM")
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "mixtral",
                         "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss")
_GEMMA = ("gemma2", "gemma3_text")
_QWEN = ("qwen2", "qwen3", "qwen3_moe")
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")
# The key each MoE family names its routed-expert count with.
_NUM_EXPERTS_KEY = {"mixtral": "num_local_experts", "qwen3_moe": "num_experts", "deepseek_v2": "n_routed_experts",
                    "deepseek_v3": "n_routed_experts", "gpt_oss": "num_local_experts"}
# MoE and MLA keys a config.json may leave out, with the configuration class's default. DeepSeek-V2's
# class defaults describe the 236B model; its configs (and V2-Lite's) carry every key, so none are assumed.
_MOE_DEFAULTS = {
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen3_moe": {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                  "decoder_sparse_step": 1},
    "deepseek_v3": {"n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
                    "n_shared_experts": 1, "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
                    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128},
    "gpt_oss": {"num_local_experts": 128, "num_experts_per_tok": 4},
}

# transformers' defaults for keys a config.json may leave out.
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "mistral": 131072, "qwen2": 32768, "qwen3": 32768, "gemma2": 8192,
                          "gemma3_text": 131072, "phi3": 4096, "mixtral": 131072, "qwen3_moe": 32768,
                          "deepseek_v2": 2048, "deepseek_v3": 4096, "gpt_oss": 131072}
# Others (Qwen3MoeConfig has no head_dim): hidden / heads. DeepSeek: qk_nope_head_dim +
# qk_rope_head_dim, whatever head_dim says.
_DEFAULT_HEAD_DIM = {"qwen3": 128, "gemma2": 256, "gemma3_text": 256, "gpt_oss": 64}
_DEFAULT_RMS_NORM_EPS = {"phi3": 1e-5, "mixtral": 1e-5, "gpt_oss": 1e-5}  # others 1e-6
_DEFAULT_ROPE_THETA = {"gemma3_text": 1_000_000.0, "mixtral": 1_000_000.0, "gpt_oss": 150000.0}  # others 10000
_DEFAULT_LOCAL_ROPE_THETA = 10000.0  # Gemma 3's sliding layers (rope_local_base_freq)
# Sliding windows when the key is absent (an explicit null means none). Qwen2/3 use theirs only
# with use_sliding_window; Llama has none.
# Mixtral's default is none (a window only when the file gives one).
_DEFAULT_SLIDING_WINDOW = {"mistral": 4096, "qwen2": 4096, "qwen3": 4096, "qwen3_moe": 4096, "gemma2": 4096,
                           "gemma3_text": 4096, "gpt_oss": 128}
_DEFAULT_SOFTCAPS = {"gemma2": (50.0, 30.0), "gemma3_text": (None, None)}  # (attention, final)
_GEMMA3_SLIDING_PATTERN = 6  # every 6th layer is global
_QWEN_MAX_WINDOW_LAYERS = 28  # layers from this index on slide, when Qwen's window is on
_LAYER_TYPES = ("full_attention", "sliding_attention")
_GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh",)


def load_hf_config(path: str | Path) -> ModelSpec:
    """Parse `path` (a config.json, or a directory holding one) into a ModelSpec."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError("no such model config file", source=str(path),
                          expected="a Hugging Face config.json or a directory holding one")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read model config: {exc}", source=str(path)) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                          source=str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError("a config.json must hold a JSON object", source=str(path),
                          expected="an object", found=type(raw).__name__)
    return model_from_hf_dict(raw, source=str(path), name=_default_name(raw, path))


def model_from_hf_dict(raw: dict[str, Any], *, source: str | None = None, name: str = "hf-model") -> ModelSpec:
    """The ModelSpec described by a parsed config.json mapping."""
    reader = _Reader(raw, source)
    model_type = _family(reader)
    _reject_unsupported_features(reader, model_type)

    num_q_heads = reader.positive_int("num_attention_heads")
    hidden_size = reader.positive_int("hidden_size")
    num_kv_heads = reader.positive_int("num_key_value_heads", default=num_q_heads)
    if num_q_heads % num_kv_heads:
        # GQA needs equal query groups per KV head (seed 21.1).
        raise ConfigError(
            f"num_attention_heads ({num_q_heads}) is not divisible by num_key_value_heads ({num_kv_heads})",
            source=source, where="num_key_value_heads", expected=f"a divisor of {num_q_heads}", found=num_kv_heads,
        )
    mla = _mla_fields(reader, model_type)
    if mla:
        # The per-head q.k width; ModelSpec sizes the cache from the latent instead.
        head_dim = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    else:
        head_dim = reader.positive_int("head_dim", default=_DEFAULT_HEAD_DIM.get(model_type))
    if head_dim is None:
        if hidden_size % num_q_heads:
            raise ConfigError(
                f"hidden_size ({hidden_size}) is not divisible by num_attention_heads ({num_q_heads}) "
                "and no head_dim is given", source=source, where="head_dim",
            )
        head_dim = hidden_size // num_q_heads

    num_layers = reader.positive_int("num_hidden_layers")
    rope_theta, rope_scaling, rope_local_theta = _rope(reader, model_type)
    sliding_window, sliding_layers = _sliding_layers(reader, model_type, num_layers)
    gemma = model_type in _GEMMA
    attn_softcap, final_softcap = _DEFAULT_SOFTCAPS.get(model_type, (None, None))
    spec = ModelSpec(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=reader.positive_int("intermediate_size"),
        vocab_size=reader.positive_int("vocab_size"),
        tie_word_embeddings=reader.boolean("tie_word_embeddings", default=gemma),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=reader.positive_int(
            "max_position_embeddings", default=_DEFAULT_MAX_POSITIONS[model_type]),
        rms_norm_eps=reader.positive_float("rms_norm_eps", default=_DEFAULT_RMS_NORM_EPS.get(model_type, 1e-6)),
        # Qwen2 hard-codes a q/k/v bias and its config.json does not say so.
        # gpt-oss's class defaults it to true.
        attention_bias=reader.boolean("attention_bias", default=model_type in ("qwen2", "gpt_oss")),
        hidden_act=_activation(reader, model_type),
        qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
        norm_weight_offset=1.0 if gemma else 0.0,
        sandwich_norms=gemma,
        embedding_scale=hidden_size**0.5 if gemma else 1.0,
        query_pre_attn_scalar=reader.positive_float("query_pre_attn_scalar", default=256.0) if gemma else None,
        attn_logit_softcapping=_optional_positive(reader, "attn_logit_softcapping", attn_softcap) if gemma else None,
        final_logit_softcapping=_optional_positive(reader, "final_logit_softcapping", final_softcap) if gemma else None,
        sliding_window=sliding_window,
        sliding_layers=sliding_layers,
        rope_local_theta=rope_local_theta,
        attention_sinks=model_type == "gpt_oss",
        **_moe_fields(reader, model_type, num_layers),
        **mla,
    )
    context_length(spec, source=source)  # a bad rope_scaling factor is this file's error, said now
    return spec


# RoPE types whose config already states the extended length in max_position_embeddings (vLLM
# applies no factor to them); "su" is longrope's old name.
_ROPE_TYPES_ALREADY_EXTENDED = ("llama3", "longrope", "su")


def context_length(model: ModelSpec, *, source: str | None = None) -> int:
    """The longest prompt + output `model` serves: the max_model_len vLLM derives from its config.

    That is max_position_embeddings, stretched by rope_scaling's `factor` for the RoPE types that
    reach past it (linear, dynamic, yarn; yarn counts from original_max_position_embeddings);
    llama3 and longrope configs (and Gemma 3's) already give the extended length. A sliding window (Mistral)
    does not shorten it: vLLM serves the full length unless the window is disabled. The other
    length keys vLLM reads (n_positions, seq_length, model_max_length, ...) belong to families
    this loader does not accept.
    """
    length = model.max_position_embeddings
    scaling = model.rope_scaling
    if not scaling:
        return length
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type in _ROPE_TYPES_ALREADY_EXTENDED or model.rope_local_theta is not None:
        # Gemma 3 (the family with a local RoPE base) states its scaled length too; vLLM skips it.
        return length
    where = f"model {model.name!r}: rope_scaling" if source is None else "rope_scaling"
    # The default type has no factor.
    factor = _positive_number(scaling.get("factor", 1.0), source=source, where=f"{where}.factor")
    if rope_type == "yarn":
        # transformers falls back to max_position_embeddings when the key is absent.
        original = scaling.get("original_max_position_embeddings", length)
        if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
            raise ConfigError("invalid value", source=source, where=f"{where}.original_max_position_embeddings",
                              expected="a positive integer", found=original)
        length = original
    stretched = length * factor
    if not math.isfinite(stretched):
        raise ConfigError("the context it gives is past any length", source=source, where=f"{where}.factor",
                          expected="a factor that keeps max_position_embeddings x factor finite", found=factor)
    return max(1, int(stretched))


class _Reader:
    """Typed look-ups in a config mapping; a JSON null counts as absent (transformers does so)."""

    _MISSING = object()

    def __init__(self, raw: dict[str, Any], source: str | None) -> None:
        self.raw = raw
        self.source = source

    def get(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw.get(key)
        if value is None:
            if default is self._MISSING:
                # A misspelt key is the usual cause: offer the closest key the file does have.
                hint = close_match(key, [k for k in self.raw if isinstance(k, str)])
                extra = f" (the file has {hint!r}; misspelt?)" if hint else ""
                raise ConfigError(f"required key is missing{extra}", source=self.source, where=key)
            return default
        return value

    def positive_int(self, key: str, default: Any = _MISSING) -> Any:
        if self.raw.get(key) is None and default is not self._MISSING:
            return default
        value = self.get(key)
        # JSON true/false arrive as bool, a subclass of int; they are never a count.
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError("invalid value", source=self.source, where=key,
                              expected="a positive integer", found=value)
        return value

    def positive_float(self, key: str, default: Any = _MISSING) -> float:
        if self.raw.get(key) is None and default is not self._MISSING:
            return default
        return _positive_number(self.get(key), source=self.source, where=key)

    def boolean(self, key: str, default: Any = _MISSING) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError("invalid value", source=self.source, where=key,
                              expected="true or false", found=value)
        return value

    def mapping(self, key: str) -> dict[str, Any] | None:
        value = self.get(key, None)
        if value is not None and not isinstance(value, dict):
            raise ConfigError("invalid value", source=self.source, where=key,
                              expected="an object or null", found=value)
        return value


def _positive_number(value: Any, *, source: str | None, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError("invalid value", source=source, where=where, expected="a finite positive number",
                          found=value)
    return float(value)


def _family(reader: _Reader) -> str:
    """The model_type, checked against the architectures ModelSpec can describe."""
    architectures = reader.get("architectures", None)
    if architectures is not None:
        if not isinstance(architectures, list) or not architectures:
            raise ConfigError("invalid value", source=reader.source, where="architectures",
                              expected="a non-empty list of class names", found=architectures)
        arch = architectures[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ConfigError("unsupported architecture", source=reader.source, where="architectures[0]",
                              expected=f"one of {list(SUPPORTED_ARCHITECTURES)}", found=arch,
                              choices=SUPPORTED_ARCHITECTURES)
        return SUPPORTED_MODEL_TYPES[SUPPORTED_ARCHITECTURES.index(arch)]
    model_type = reader.get("model_type", "llama")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError("unsupported model_type", source=reader.source, where="model_type",
                          expected=f"one of {list(SUPPORTED_MODEL_TYPES)}", found=model_type,
                          choices=SUPPORTED_MODEL_TYPES)
    return model_type


def _reject_unsupported_features(reader: _Reader, model_type: str) -> None:
    # ModelSpec describes a gated MLP without bias and a causal decoder; anything else would be
    # priced and run wrongly.
    if reader.boolean("mlp_bias", default=False):
        raise ConfigError("mlp_bias is not supported", source=reader.source, where="mlp_bias",
                          expected="false", found=True)
    if model_type in _GEMMA:
        if reader.boolean("use_bidirectional_attention", default=False):
            raise ConfigError("bidirectional attention is not supported (a causal decoder is)", source=reader.source,
                              where="use_bidirectional_attention", expected="false or null", found=True)
        if reader.boolean("attention_bias", default=False):
            # Gemma would put it on o_proj too, which ModelSpec does not describe.
            raise ConfigError("attention_bias is not supported for Gemma", source=reader.source,
                              where="attention_bias", expected="false", found=True)
    if model_type == "phi3":
        params = reader.mapping("rope_parameters") or {}
        in_params = reader.raw.get("partial_rotary_factor") is None
        factor = params.get("partial_rotary_factor", 1.0) if in_params else reader.raw["partial_rotary_factor"]
        if factor != 1.0:
            where = "rope_parameters.partial_rotary_factor" if in_params else "partial_rotary_factor"
            raise ConfigError("partial rotary embeddings are not supported", source=reader.source, where=where,
                              expected="1.0", found=factor)


def _moe_fields(reader: _Reader, model_type: str, num_layers: int) -> dict[str, Any]:
    """ModelSpec's mixture-of-experts fields: expert counts and widths, and which layers are sparse
    (as each family's modeling code decides); none for a dense family."""
    if model_type not in _NUM_EXPERTS_KEY:
        return {}
    defaults = _MOE_DEFAULTS.get(model_type, {})
    experts_key = _NUM_EXPERTS_KEY[model_type]
    # transformers maps num_experts and num_local_experts onto one attribute for these two; a file may use either.
    other_key = {"qwen3_moe": "num_local_experts", "gpt_oss": "num_experts"}.get(model_type)
    if other_key and reader.raw.get(experts_key) is None and reader.raw.get(other_key) is not None:
        experts_key = other_key
    num_experts = reader.positive_int(experts_key, default=defaults.get(experts_key, _Reader._MISSING))
    top_k = reader.positive_int("num_experts_per_tok", default=defaults.get("num_experts_per_tok", _Reader._MISSING))
    if top_k > num_experts:
        raise ConfigError(f"num_experts_per_tok ({top_k}) is more than the {num_experts} experts ({experts_key})",
                          source=reader.source, where="num_experts_per_tok", expected=f"at most {num_experts}",
                          found=top_k)
    fields: dict[str, Any] = {"num_experts": num_experts, "num_experts_per_tok": top_k,
                              "moe_bias": model_type == "gpt_oss"}
    if model_type in ("qwen3_moe", *_DEEPSEEK):
        fields["moe_intermediate_size"] = reader.positive_int(
            "moe_intermediate_size", default=defaults.get("moe_intermediate_size", _Reader._MISSING))
    dense: list[int] = []
    if model_type in _DEEPSEEK:
        fields["num_shared_experts"] = _non_negative_int(reader, "n_shared_experts", defaults)
        first_dense = _non_negative_int(reader, "first_k_dense_replace", defaults)
        if first_dense > num_layers:
            raise ConfigError("more leading dense layers than layers", source=reader.source,
                              where="first_k_dense_replace", expected=f"at most num_hidden_layers ({num_layers})",
                              found=first_dense)
        frequency = reader.positive_int("moe_layer_freq", default=1)
        # DeepSeek's modeling code: layer i is sparse when i >= first_k_dense_replace and i % moe_layer_freq == 0.
        dense = [i for i in range(num_layers) if i < first_dense or i % frequency]
    elif model_type == "qwen3_moe":
        step = reader.positive_int("decoder_sparse_step", default=defaults["decoder_sparse_step"])
        only = reader.get("mlp_only_layers", [])
        if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers
                                             for i in only):
            raise ConfigError("invalid value", source=reader.source, where="mlp_only_layers",
                              expected=f"a list of layer indices in [0, {num_layers})", found=only)
        # Qwen3MoeDecoderLayer: sparse unless listed in mlp_only_layers, every decoder_sparse_step-th layer.
        dense = [i for i in range(num_layers) if i in only or (i + 1) % step]
    fields["dense_mlp_layers"] = tuple(dense)
    expert_dtype = _expert_weight_dtype(reader)
    if expert_dtype is not None:
        fields["expert_weight_dtype"] = expert_dtype
    return fields


def _expert_weight_dtype(reader: _Reader) -> str | None:
    """The routed experts' stored dtype where `quantization_config` quantizes them apart: MXFP4
    (quant_method mxfp4, as openai/gpt-oss ships: the experts in MXFP4, modules_to_not_convert
    the attention, router, embeddings and lm_head). Other quantization methods describe the
    whole model, which an experiment's weight_dtype says; None for them."""
    quant = reader.mapping("quantization_config")
    if quant is None or quant.get("quant_method") != "mxfp4":
        return None
    return "mxfp4"


def _mla_fields(reader: _Reader, model_type: str) -> dict[str, Any]:
    """ModelSpec's multi-head latent attention fields (DeepSeek-V2/V3); none for other families."""
    if model_type not in _DEEPSEEK:
        return {}
    defaults = _MOE_DEFAULTS.get(model_type, {})
    fields = {key: reader.positive_int(key, default=defaults.get(key, _Reader._MISSING))
              for key in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
    if "q_lora_rank" in reader.raw and reader.raw["q_lora_rank"] is None:
        fields["q_lora_rank"] = 0  # DeepSeek-V2-Lite: q is one projection, no low-rank step
    else:
        default = defaults.get("q_lora_rank", _Reader._MISSING)
        fields["q_lora_rank"] = reader.positive_int("q_lora_rank", default=default)
    return fields


def _non_negative_int(reader: _Reader, key: str, defaults: dict[str, Any]) -> int:
    value = reader.get(key, defaults.get(key, _Reader._MISSING))
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError("invalid value", source=reader.source, where=key, expected="a non-negative integer",
                          found=value)
    return value


def _activation(reader: _Reader, model_type: str) -> str:
    """The MLP activation: SiLU, or Gemma's tanh-approximated GELU (its own key, hidden_activation)."""
    if model_type in _GEMMA:
        key = "hidden_activation" if reader.raw.get("hidden_activation") is not None else "hidden_act"
        act = reader.get(key, "gelu_pytorch_tanh")
        expected = _GEMMA_ACTIVATIONS
    else:
        key, act, expected = "hidden_act", reader.get("hidden_act", "silu"), ("silu",)
    if act not in expected:
        raise ConfigError(f"unsupported {key}", source=reader.source, where=key,
                          expected=" or ".join(repr(a) for a in expected), found=act)
    return act


def _optional_positive(reader: _Reader, key: str, default: float | None) -> float | None:
    """A positive number; `default` when the key is absent, None when it is an explicit null."""
    if key not in reader.raw:
        return default
    if reader.raw[key] is None:
        return None
    return reader.positive_float(key)


def _sliding_layers(reader: _Reader, model_type: str, num_layers: int) -> tuple[int | None, tuple[int, ...]]:
    """(sliding_window, indices of the layers that use it), as each family's modeling code decides."""
    if model_type == "llama" or model_type in _DEEPSEEK:
        return None, ()
    if model_type in _QWEN and not reader.boolean("use_sliding_window", default=False):
        return None, ()  # Qwen's sliding_window key is inert unless use_sliding_window is true
    if "sliding_window" in reader.raw and reader.raw["sliding_window"] is None:
        return None, ()
    window = reader.positive_int("sliding_window", default=_DEFAULT_SLIDING_WINDOW.get(model_type))
    if window is None:
        return None, ()
    if model_type in ("mistral", "phi3", "mixtral"):
        return window, tuple(range(num_layers))  # one window for every layer; layer_types unused
    types = reader.get("layer_types", None)
    if types is None:
        if model_type == "gemma2":
            sliding = [i for i in range(num_layers) if (i + 1) % 2]
        elif model_type == "gpt_oss":
            sliding = [i for i in range(num_layers) if i % 2 == 0]  # GptOssConfig: sliding, full, sliding, ...
        elif model_type == "gemma3_text":
            pattern = reader.positive_int("sliding_window_pattern", default=_GEMMA3_SLIDING_PATTERN)
            sliding = [i for i in range(num_layers) if (i + 1) % pattern]
        else:
            first = reader.get("max_window_layers", _QWEN_MAX_WINDOW_LAYERS)
            if isinstance(first, bool) or not isinstance(first, int) or first < 0:
                raise ConfigError("invalid value", source=reader.source, where="max_window_layers",
                                  expected="a non-negative integer", found=first)
            sliding = list(range(first, num_layers))
        return window, tuple(sliding)
    if not isinstance(types, list) or len(types) != num_layers or any(t not in _LAYER_TYPES for t in types):
        raise ConfigError("invalid value", source=reader.source, where="layer_types",
                          expected=f"a list of {num_layers} entries, each one of {list(_LAYER_TYPES)}",
                          found=types)
    return window, tuple(i for i, t in enumerate(types) if t == "sliding_attention")


def _rope(reader: _Reader, model_type: str) -> tuple[float, dict[str, Any] | None, float | None]:
    """(rope_theta, rope_scaling, local theta) from either spelling; rope_scaling is None for plain RoPE.

    The local theta is Gemma 3's base for its sliding layers (None elsewhere); rope_theta and
    rope_scaling then belong to its full-attention layers.
    """
    params = reader.mapping("rope_parameters")
    where = "rope_parameters"
    local_theta = None
    if model_type == "gemma3_text":
        local_theta = reader.positive_float("rope_local_base_freq", default=_DEFAULT_LOCAL_ROPE_THETA)
        if params is not None and ("full_attention" in params or "sliding_attention" in params):
            # transformers 5: one mapping per layer type.
            local = params.get("sliding_attention") or {}
            if local.get("rope_type", "default") != "default":
                raise ConfigError("scaled RoPE on sliding layers is not supported", source=reader.source,
                                  where="rope_parameters.sliding_attention.rope_type", expected="'default'",
                                  found=local.get("rope_type"))
            if local.get("rope_theta") is not None:
                local_theta = _positive_number(local["rope_theta"], source=reader.source,
                                               where="rope_parameters.sliding_attention.rope_theta")
            params, where = params.get("full_attention"), "rope_parameters.full_attention"
            if params is not None and not isinstance(params, dict):
                raise ConfigError("invalid value", source=reader.source, where=where,
                                  expected="an object or null", found=params)
    default_theta = _DEFAULT_ROPE_THETA.get(model_type, 10000.0)
    if reader.raw.get("rope_theta") is not None or params is None or params.get("rope_theta") is None:
        theta = reader.positive_float("rope_theta", default=default_theta)
    else:
        theta = _positive_number(params["rope_theta"], source=reader.source, where=f"{where}.rope_theta")
    scaling = reader.mapping("rope_scaling")
    if scaling is None and params is not None:
        rest = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
        if rest.get("rope_type", "default") != "default":
            scaling = rest
    return theta, scaling, local_theta


def _default_name(raw: dict[str, Any], path: Path) -> str:
    """`_name_or_path` when the file carries one, else the folder holding config.json."""
    name = raw.get("_name_or_path")
    if isinstance(name, str) and name:
        return name
    return path.parent.name or path.stem
