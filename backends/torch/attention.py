"""Paged attention for one flattened step: write the new K/V into the pool, then attend.

Rows are ordered single-query rows first (decodes, and prompt chunks of one token), then the
multi-token pieces (prefill chunks). Single-query rows go to a decode backend that reads the
pool through block tables: `portable` (gather + SDPA, runs anywhere), `triton` (paged
flash-decoding kernel reading blocks in place) or `flex` (FlexAttention with a paged block mask).
Multi-token pieces are compute bound and use SDPA over their gathered context (or over the fresh
K/V alone when the piece starts at position 0), on every device.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F
from torch.nn.attention.bias import causal_lower_right

from backends.torch.kv_pool import KVPool
from simcore.errors import ConfigError

ATTENTION_CHOICES = ("auto", "portable", "triton", "flex")


@dataclass
class PrefillPiece:
    """A multi-token piece of one request: rows start..start+num_tokens-1 of the batch."""

    start: int
    num_tokens: int
    context_len: int
    # Flat slot ids of positions 0 .. context_len+num_tokens-1 (device), when context_len > 0.
    kv_slots: torch.Tensor | None = None


@dataclass
class AttentionMetadata:
    """Everything attention needs for one step; device tensors built once, shared by all layers."""

    # Flat pool slot (block * block_size + offset) of every row's new K/V, [T].
    slot_mapping: torch.Tensor
    # Rows 0..num_decode-1 are single-query rows.
    num_decode: int = 0
    # [num_decode, width] physical blocks of each single-query row (padding entries unused).
    decode_block_tables: torch.Tensor | None = None
    # [num_decode] keys each single-query row attends to (its context + itself).
    decode_seq_lens: torch.Tensor | None = None
    # Host-side max of decode_seq_lens, so no device sync is needed to size work.
    decode_max_len: int = 0
    prefills: list[PrefillPiece] = field(default_factory=list)
    # Per-step state a decode backend computes once for all layers (block masks, split counts).
    backend_state: object = None


def resolve_backend(name: str, device: torch.device, *, source: object = None, max_blocks_per_seq: int | None = None):
    """The decode backend for `name` on `device` ('auto': triton on CUDA when importable)."""
    if name not in ATTENTION_CHOICES:
        raise ConfigError("unknown attention backend", source=source, where="cost_model.attention",
                          expected=f"one of {list(ATTENTION_CHOICES)}", found=name, choices=ATTENTION_CHOICES)
    has_triton = importlib.util.find_spec("triton") is not None
    if name == "auto":
        name = "triton" if device.type == "cuda" and has_triton else "portable"
    if name == "portable":
        return PortableDecode()
    if name == "flex":
        from backends.torch.flex_decode import FlexDecode

        return FlexDecode(compiled=device.type == "cuda", max_blocks_per_seq=max_blocks_per_seq)
    if not has_triton:
        raise ConfigError("attention 'triton' needs the triton package, which is not importable",
                          source=source, where="cost_model.attention")
    from backends.torch.triton_decode import TritonDecode, interpreter_enabled

    if device.type != "cuda" and not interpreter_enabled():
        raise ConfigError("attention 'triton' runs on CUDA devices only (or with TRITON_INTERPRET=1 for tests)",
                          source=source, where="cost_model.attention")
    return TritonDecode()


class PortableDecode:
    """Gather each row's keys through its block table into a padded batch, then masked SDPA."""

    name = "portable"

    def begin_step(self, meta: AttentionMetadata) -> None:
        positions = torch.arange(meta.decode_max_len, device=meta.slot_mapping.device)
        meta.backend_state = (positions, positions[None, :] < meta.decode_seq_lens[:, None])

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata, scale: float) -> torch.Tensor:
        positions, valid = meta.backend_state
        block_size = k_cache.shape[1]
        tables = meta.decode_block_tables
        blocks = tables.gather(1, (positions // block_size).expand(tables.shape[0], -1))
        slots = blocks * block_size + positions % block_size  # [B, L]
        keys = flat(k_cache)[slots].transpose(1, 2)  # [B, H_KV, L, d]
        values = flat(v_cache)[slots].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q[:, :, None, :], keys, values, attn_mask=valid[:, None, None, :], scale=scale, enable_gqa=True
        )
        return out[:, :, 0, :]


def flat(cache: torch.Tensor) -> torch.Tensor:
    """[blocks, block_size, H, d] -> [slots, H, d] (a view: the pool is contiguous per layer)."""
    return cache.view(-1, cache.shape[2], cache.shape[3])


def prefill_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of q [Lq, H_Q, d] over keys/values [Lk, H_KV, d], the queries being the last Lq positions."""
    lq, lk = q.shape[0], keys.shape[0]
    qt, kt, vt = q.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None]
    if lq == lk:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale, enable_gqa=True)
    else:
        # Queries sit at the end of the context: lower-right aligned causal mask. Repeat K/V heads
        # here because the fused kernels behind CausalBias do not all accept grouped heads.
        groups = q.shape[1] // keys.shape[1]
        if groups > 1:
            kt, vt = kt.repeat_interleave(groups, dim=1), vt.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=causal_lower_right(lq, lk), scale=scale)
    return out[0].transpose(0, 1)


class StepAttention:
    """The `attend` callable the model calls per layer during one step."""

    def __init__(self, pool: KVPool, meta: AttentionMetadata, decode_backend, head_dim: int) -> None:
        self.pool, self.meta, self.decode = pool, meta, decode_backend
        self.scale = 1.0 / math.sqrt(head_dim)
        if meta.num_decode:
            decode_backend.begin_step(meta)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        k_cache, v_cache = self.pool.layer(layer)
        # Store first: the queries below read their own keys from the pool like any other.
        flat(k_cache).index_copy_(0, meta.slot_mapping, k)
        flat(v_cache).index_copy_(0, meta.slot_mapping, v)
        nd = meta.num_decode
        if not meta.prefills:
            return self.decode(q, k_cache, v_cache, meta, self.scale)
        pieces = [self.decode(q[:nd], k_cache, v_cache, meta, self.scale)] if nd else []
        for piece in meta.prefills:
            rows = slice(piece.start, piece.start + piece.num_tokens)
            if piece.kv_slots is None:
                keys, values = k[rows], v[rows]
            else:
                keys, values = flat(k_cache)[piece.kv_slots], flat(v_cache)[piece.kv_slots]
            pieces.append(prefill_attention(q[rows], keys, values, self.scale))
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)
