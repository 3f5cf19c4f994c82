"""Which ModelSpecs the real engine can run (torch-free, so the check is testable without torch).

The engine is a Llama-family decoder (backends/torch/model.py): GQA attention over a paged K/V
pool and one dense gated MLP per layer. Models the roofline prices but the engine does not
implement are refused with a ConfigError that names the feature, before any weights are made.
"""

from __future__ import annotations

from simcore.errors import ConfigError
from simcore.model import ModelSpec


def unsupported_features(spec: ModelSpec) -> list[str]:
    """The architecture features of `spec` the real engine does not implement (empty: it runs)."""
    features = []
    if spec.is_moe:
        features.append(f"mixture-of-experts MLP layers ({spec.num_experts} experts, top-{spec.num_experts_per_tok})")
    if spec.is_mla:
        features.append(f"multi-head latent attention (kv_lora_rank {spec.kv_lora_rank})")
    if spec.attention_sinks:
        features.append("attention sinks")
    return features


def check_engine_supports(spec: ModelSpec, *, source: object = None) -> None:
    """Raise a ConfigError naming what the real engine cannot run in `spec`."""
    features = unsupported_features(spec)
    if features:
        raise ConfigError(
            f"model {spec.name!r} uses {' and '.join(features)}, which the real engine (cost_model torch, "
            "a Llama-family decoder) does not implement; price it with the roofline cost model",
            source=None if source is None else str(source), where="model")
