"""Selecting tokens from logits: greedy, or temperature with nucleus (top-p) filtering.

Random draws come from a counter-based hash of (seed, request_id, output index) rather than a
stream generator, so a request's k-th output does not depend on which other requests shared
its batches: a simulated schedule and any other schedule of the same requests sample alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 selects greedily (argmax)
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def uniforms(seed: int, request_ids: list[int], indices: list[int]) -> np.ndarray:
    """One U[0, 1) per (request, output index), by splitmix64 over a combined counter."""
    with np.errstate(over="ignore"):
        x = (np.asarray([r & _MASK64 for r in request_ids], dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
             + np.asarray(indices, dtype=np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
             + np.uint64(seed & _MASK64))
        for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            x ^= x >> np.uint64(shift)
            x *= np.uint64(mult)
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def sample(logits: torch.Tensor, params: SamplingParams, u: np.ndarray | None = None) -> list[int]:
    """Token ids for each row of float32 logits [rows, vocab]; `u` holds one draw per row."""
    if params.greedy:
        return logits.argmax(dim=-1).tolist()
    probs = torch.softmax(logits / params.temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cumulative = sorted_probs.cumsum(dim=-1)
    # Nucleus: keep the smallest prefix whose mass reaches top_p (always the top token).
    keep = (cumulative - sorted_probs) < params.top_p
    kept = sorted_probs * keep
    cdf = kept.cumsum(dim=-1)
    draws = torch.as_tensor(u, dtype=torch.float32, device=logits.device)[:, None] * cdf[:, -1:]
    picks = torch.searchsorted(cdf, draws, right=True).clamp_(max=logits.shape[-1] - 1)
    return order.gather(1, picks).squeeze(1).tolist()
