"""Rotary position embeddings, including Llama 3's long-context frequency rescaling.

Written to reproduce Hugging Face's Llama numerics: inverse frequencies and angles in float32,
cos/sin cast to the activation dtype, the 'rotate half' (non-interleaved) pairing of dimensions.
"""

from __future__ import annotations

import math

import torch

from simcore.errors import ServesimError
from simcore.model import ModelSpec


def inverse_frequencies(spec: ModelSpec) -> torch.Tensor:
    """One inverse frequency per rotated pair, float32, after any rope_scaling of the spec."""
    dim = spec.head_dim
    base = float(spec.rope_theta)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = dict(spec.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        # Position interpolation: positions divided by the factor, i.e. frequencies divided.
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        return _llama3_frequencies(inv_freq, scaling)
    raise ServesimError(
        f"model {spec.name!r}: rope_scaling type {kind!r} is not supported by the torch backend "
        "(supported: default, linear, llama3)"
    )


def _llama3_frequencies(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, and the band between
    # blended smoothly, so the model keeps local resolution while reaching 8x further.
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [T, head_dim] for integer positions [T]."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] by the per-position angles (broadcast over heads)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
