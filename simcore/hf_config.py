"""Reading a Hugging Face `config.json` (Llama, Mistral, Qwen2 families) into a ModelSpec.

Key names and defaults follow the transformers configuration classes LlamaConfig,
MistralConfig and Qwen2Config. Both spellings of RoPE settings are accepted: `rope_theta` and
`rope_scaling` (transformers 4.x) and a `rope_parameters` mapping (transformers 5).
`context_length` derives a model's context (the default max_model_len) as vLLM does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from simcore.errors import ConfigError, close_match
from simcore.model import ModelSpec

# Architectures whose decoder layer ModelSpec describes, by config.json `architectures` entry
# and by `model_type`.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

# transformers' defaults for keys a config.json may leave out.
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "mistral": 131072, "qwen2": 32768}
_DEFAULT_RMS_NORM_EPS = 1e-6
_DEFAULT_ROPE_THETA = 10000.0


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
    _reject_unsupported_features(reader)

    num_q_heads = reader.positive_int("num_attention_heads")
    hidden_size = reader.positive_int("hidden_size")
    num_kv_heads = reader.positive_int("num_key_value_heads", default=num_q_heads)
    if num_q_heads % num_kv_heads:
        # GQA needs equal query groups per KV head (seed 21.1).
        raise ConfigError(
            f"num_attention_heads ({num_q_heads}) is not divisible by num_key_value_heads ({num_kv_heads})",
            source=source, where="num_key_value_heads", expected=f"a divisor of {num_q_heads}", found=num_kv_heads,
        )
    head_dim = reader.positive_int("head_dim", default=None)
    if head_dim is None:
        if hidden_size % num_q_heads:
            raise ConfigError(
                f"hidden_size ({hidden_size}) is not divisible by num_attention_heads ({num_q_heads}) "
                "and no head_dim is given", source=source, where="head_dim",
            )
        head_dim = hidden_size // num_q_heads

    rope_theta, rope_scaling = _rope(reader)
    spec = ModelSpec(
        name=name,
        num_layers=reader.positive_int("num_hidden_layers"),
        hidden_size=hidden_size,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=reader.positive_int("intermediate_size"),
        vocab_size=reader.positive_int("vocab_size"),
        tie_word_embeddings=reader.boolean("tie_word_embeddings", default=False),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=reader.positive_int(
            "max_position_embeddings", default=_DEFAULT_MAX_POSITIONS[model_type]),
        rms_norm_eps=reader.positive_float("rms_norm_eps", default=_DEFAULT_RMS_NORM_EPS),
        # Qwen2 hard-codes a q/k/v bias and its config.json does not say so.
        attention_bias=reader.boolean("attention_bias", default=model_type == "qwen2"),
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
    llama3 and longrope configs already give the extended length. A sliding window (Mistral)
    does not shorten it: vLLM serves the full length unless the window is disabled. The other
    length keys vLLM reads (n_positions, seq_length, model_max_length, ...) belong to families
    this loader does not accept.
    """
    length = model.max_position_embeddings
    scaling = model.rope_scaling
    if not scaling:
        return length
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type in _ROPE_TYPES_ALREADY_EXTENDED:
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


def _reject_unsupported_features(reader: _Reader) -> None:
    # ModelSpec describes a SwiGLU MLP without bias; anything else would be priced and run wrongly.
    act = reader.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError("unsupported hidden_act", source=reader.source, where="hidden_act",
                          expected="'silu'", found=act)
    if reader.boolean("mlp_bias", default=False):
        raise ConfigError("mlp_bias is not supported", source=reader.source, where="mlp_bias",
                          expected="false", found=True)


def _rope(reader: _Reader) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either spelling; rope_scaling is None for plain RoPE."""
    params = reader.mapping("rope_parameters")
    if reader.raw.get("rope_theta") is not None or params is None or params.get("rope_theta") is None:
        theta = reader.positive_float("rope_theta", default=_DEFAULT_ROPE_THETA)
    else:
        theta = _positive_number(params["rope_theta"], source=reader.source, where="rope_parameters.rope_theta")
    scaling = reader.mapping("rope_scaling")
    if scaling is None and params is not None:
        rest = {k: v for k, v in params.items() if k != "rope_theta"}
        if rest.get("rope_type", "default") != "default":
            scaling = rest
    return theta, scaling


def _default_name(raw: dict[str, Any], path: Path) -> str:
    """`_name_or_path` when the file carries one, else the folder holding config.json."""
    name = raw.get("_name_or_path")
    if isinstance(name, str) and name:
        return name
    return path.parent.name or path.stem
