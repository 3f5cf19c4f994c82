"""Paged attention for one flattened step: write the new K/V into the pool, then attend.

Rows are ordered single-query rows first (decodes, and prompt chunks of one token), then the
multi-token pieces (prefill chunks). Single-query rows go to a decode backend that reads the
pool through block tables: `portable` (gather + SDPA, runs anywhere), `triton` (paged
flash-decoding kernel reading blocks in place) or `flex` (FlexAttention with a paged block mask).
Multi-token pieces, however many, go through one padded-batch SDPA call per layer: each piece's
queries are a row of a [pieces, max new tokens] batch, its keys (context and itself, read back
from the pool) a row of [pieces, max end], and a per-piece causal mask hides what it may not
see. So a layer makes at most two attention calls (decodes, then pieces) instead of one per piece.

Sliding-window layers add `key > query - window` to every mask; soft-capped layers (Gemma 2)
compute the scores explicitly, since SDPA cannot cap them. The masks are built once per step and
shared by all layers.

On CUDA the engine runs its eager forwards under `sdpa_backends` (no cuDNN attention, see there),
and masked grouped-query pieces repeat their K/V heads so that the memory-efficient kernel, not the
math fallback, takes them.
"""

from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from backends.torch.kv_pool import KVPool
from simcore.errors import ConfigError
from simcore.model import ModelSpec

ATTENTION_CHOICES = ("auto", "portable", "triton", "flex")

# SDPA kernels the eager forward may use on CUDA: every one but cuDNN attention, which torch puts
# first on sm90/sm100 with cuDNN > 9.15 and which builds an execution plan per distinct (batch,
# heads, query length, key length) the first time it meets one (tens of ms). A serving run meets a
# new prompt length at almost every prefill step, and a profile (each shape timed after an untimed
# first run) never sees that cost: on the first H200 run (torch 2.11) prompt steps took 45-90 ms
# more the first time their shape came up, 2-4x their profiled time (benchmarks/results/
# h200-2026-12-04). Flash and memory-efficient attention have no per-shape setup.
NO_CUDNN_SDPA = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def sdpa_backends(device: torch.device, *, allow_cudnn: bool = False) -> contextlib.AbstractContextManager:
    """The SDPA kernels an eager forward on `device` may use: all but cuDNN on CUDA (unless allowed)."""
    if device.type != "cuda" or allow_cudnn:
        return contextlib.nullcontext()
    return sdpa_kernel(list(NO_CUDNN_SDPA))


@dataclass
class PrefillPiece:
    """A multi-token piece of one request: rows start..start+num_tokens-1 of the batch."""

    start: int
    num_tokens: int
    context_len: int


@dataclass
class PrefillBatch:
    """Every multi-token piece of a step as one padded batch (device tensors)."""

    # [P, Lq] row of the step's flat batch each padded query reads (padding repeats a piece's last row).
    query_rows: torch.Tensor
    # [P, Lq] position of each padded query (padding repeats the last, so no mask row is empty).
    query_positions: torch.Tensor
    # [P, Lk] pool slot of key position j of each piece (padding: slot of position 0, masked).
    key_slots: torch.Tensor
    # [rows of the pieces] index into the flattened [P * Lq] output of each real query, in row order.
    output_index: torch.Tensor
    # Every piece starts at position 0 and has Lq tokens (a batch of whole, equal prompts): the
    # rows are already a [P, Lq] batch and plain causal attention over the fresh K/V is exact.
    fresh_and_equal: bool = False


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
    prefill_batch: PrefillBatch | None = None
    # Per-step state a decode backend computes once for all layers (block masks, split counts).
    backend_state: object = None


def resolve_backend(name: str, device: torch.device, *, source: object = None, max_blocks_per_seq: int | None = None,
                    spec: ModelSpec | None = None):
    """The decode backend for `name` on `device` ('auto': triton on CUDA when importable).

    Sliding windows and soft-capping are implemented by the portable backend only; 'auto' picks
    it for models that need them, and naming another backend for such a model is an error.
    """
    if name not in ATTENTION_CHOICES:
        raise ConfigError("unknown attention backend", source=source, where="cost_model.attention",
                          expected=f"one of {list(ATTENTION_CHOICES)}", found=name, choices=ATTENTION_CHOICES)
    needs_portable = spec is not None and (spec.num_sliding_layers > 0 or spec.attn_logit_softcapping is not None)
    has_triton = importlib.util.find_spec("triton") is not None
    if name == "auto":
        name = "triton" if device.type == "cuda" and has_triton and not needs_portable else "portable"
    if name == "portable":
        return PortableDecode()
    if needs_portable:
        raise ConfigError(f"model {spec.name!r} uses sliding-window attention or attention soft-capping, "
                          f"which attention {name!r} does not implement", source=source,
                          where="cost_model.attention", expected="'portable' or 'auto'", found=name)
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


@dataclass
class _PortableState:
    # window (None: full attention) -> [B, 1, 1, width * block_size]: the keys each row may read.
    masks: dict[int | None, torch.Tensor]


class PortableDecode:
    """Gather each row's blocks into a padded batch, then masked SDPA.

    Whole blocks are gathered with index_select (contiguous copies, several times faster than
    indexing slot by slot); positions past a row's length are masked. The masks are computed at
    the first layer and reused by the rest. Query heads are folded onto their KV head
    ([B, H_KV, group, d]), so grouped-query attention needs neither repeated K/V nor SDPA's GQA path.
    """

    name = "portable"

    def begin_step(self, meta: AttentionMetadata) -> None:
        meta.backend_state = None  # built at the first layer, where the block size is known

    def _mask(self, meta: AttentionMetadata, block_size: int, window: int | None) -> torch.Tensor:
        if meta.backend_state is None:
            tables, lens = meta.decode_block_tables, meta.decode_seq_lens
            positions = torch.arange(tables.shape[1] * block_size, device=tables.device)
            meta.backend_state = _PortableState({None: (positions[None, :] < lens[:, None])[:, None, None, :]})
        masks = meta.backend_state.masks
        if window not in masks:
            positions = torch.arange(masks[None].shape[-1], device=masks[None].device)
            # A row's query sits at position seq_len - 1; the window keeps the keys above it - window.
            recent = positions[None, :] >= (meta.decode_seq_lens - window)[:, None]
            masks[window] = masks[None] & recent[:, None, None, :]
        return masks[window]

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata, scale: float, window: int | None = None,
                 softcap: float | None = None) -> torch.Tensor:
        num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
        mask = self._mask(meta, block_size, window)
        tables = meta.decode_block_tables
        rows, num_q_heads = q.shape[0], q.shape[1]
        shape = (rows, tables.shape[1] * block_size, num_kv_heads, head_dim)
        keys = k_cache.index_select(0, tables.view(-1)).view(shape).transpose(1, 2)  # [B, H_KV, L, d]
        values = v_cache.index_select(0, tables.view(-1)).view(shape).transpose(1, 2)
        folded = q.view(rows, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
        out = masked_attention(folded, keys, values, mask, scale, softcap)
        return out.reshape(rows, num_q_heads, head_dim)


def masked_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float,
                     softcap: float | None = None, *, repeat_kv: bool = False) -> torch.Tensor:
    """SDPA of q [B, H, Lq, d] over keys/values [B, H_KV, Lk, d] (H a multiple of H_KV) under a bool mask.

    With `softcap` the scores are capped (cap * tanh(s / cap)) before the mask, as Gemma 2 does;
    SDPA has no such hook, so that path computes the scores explicitly. `repeat_kv` copies each
    K/V head to its query heads instead of asking SDPA for grouped-query attention: with cuDNN
    excluded, no fused kernel of torch 2.11 takes a mask with grouped heads (flash takes no mask,
    memory-efficient attention no grouped heads until later releases), so without the copy a masked
    prompt piece runs the math kernel, which materialises every score. The same attention, exactly.
    """
    groups = q.shape[1] // keys.shape[1]
    if softcap is None:
        if repeat_kv and groups > 1:
            keys, values = repeat_heads(keys, groups), repeat_heads(values, groups)
            groups = 1
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=groups > 1)
    b, h, lq, d = q.shape
    # Fold query heads onto their KV head so one matmul serves the group without repeating K/V.
    folded = q.reshape(b, keys.shape[1], groups * lq, d)
    scores = torch.matmul(folded, keys.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(b, keys.shape[1], groups, lq, -1).masked_fill(~mask[:, :, None], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype).view(b, keys.shape[1], groups * lq, -1)
    return torch.matmul(probs, values).view(b, h, lq, d)


def repeat_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, H_KV, L, d] -> [B, H_KV * groups, L, d]: query head h reads KV head h // groups (as enable_gqa)."""
    b, h, length, d = x.shape
    return x[:, :, None].expand(b, h, groups, length, d).reshape(b, h * groups, length, d)


def flat(cache: torch.Tensor) -> torch.Tensor:
    """[blocks, block_size, H, d] -> [slots, H, d] (a view: the pool is contiguous per layer)."""
    return cache.view(-1, cache.shape[2], cache.shape[3])


class StepAttention:
    """The `attend` callable the model calls per layer during one step."""

    def __init__(self, pool: KVPool, meta: AttentionMetadata, decode_backend, spec: ModelSpec) -> None:
        self.pool, self.meta, self.decode, self.spec = pool, meta, decode_backend, spec
        self.scale = spec.attention_scale
        self.softcap = spec.attn_logit_softcapping
        if meta.num_decode:
            decode_backend.begin_step(meta)
        # Piece masks per window (None: full attention), built at first use.
        self._piece_masks: dict[int | None, torch.Tensor] = {}

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        k_cache, v_cache = self.pool.layer(layer)
        # Store first: the queries below read their own keys from the pool like any other.
        flat(k_cache).index_copy_(0, meta.slot_mapping, k)
        flat(v_cache).index_copy_(0, meta.slot_mapping, v)
        window = self.spec.sliding_window if self.spec.is_sliding(layer) else None
        nd = meta.num_decode
        plain = window is None and self.softcap is None  # what every decode backend implements
        if nd:
            decode_q = q if meta.prefill_batch is None else q[:nd]
            if plain:
                decoded = self.decode(decode_q, k_cache, v_cache, meta, self.scale)
            else:
                decoded = self.decode(decode_q, k_cache, v_cache, meta, self.scale, window, self.softcap)
            if meta.prefill_batch is None:
                return decoded
        pieces = self._pieces(q, k, v, k_cache, v_cache, window)
        return torch.cat([decoded, pieces]) if nd else pieces

    def _pieces(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, window: int | None) -> torch.Tensor:
        batch = self.meta.prefill_batch
        (num_pieces, max_new), max_end = batch.query_rows.shape, batch.key_slots.shape[1]
        if batch.fresh_and_equal and self.softcap is None and (window is None or window >= max_new):
            # No gathers and no mask: SDPA's causal kernel skips the tiles above the diagonal.
            first = self.meta.num_decode
            queries = q[first:].view(num_pieces, max_new, *q.shape[1:]).transpose(1, 2)
            keys = k[first:].view(num_pieces, max_new, *k.shape[1:]).transpose(1, 2)
            values = v[first:].view(num_pieces, max_new, *k.shape[1:]).transpose(1, 2)
            out = F.scaled_dot_product_attention(queries, keys, values, is_causal=True, scale=self.scale,
                                                 enable_gqa=q.shape[1] != k.shape[1])
            return out.transpose(1, 2).reshape(num_pieces * max_new, *q.shape[1:])
        mask = self._piece_mask(window)
        # index_select, not tensor indexing: it copies whole rows and is several times faster.
        queries = q.index_select(0, batch.query_rows.view(-1)).view(num_pieces, max_new, *q.shape[1:])
        key_shape = (num_pieces, max_end, k.shape[1], k.shape[2])
        keys = flat(k_cache).index_select(0, batch.key_slots.view(-1)).view(key_shape)
        values = flat(v_cache).index_select(0, batch.key_slots.view(-1)).view(key_shape)
        out = masked_attention(queries.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), mask,
                               self.scale, self.softcap, repeat_kv=q.device.type == "cuda")  # [P, H_Q, Lq, d]
        out = out.transpose(1, 2).reshape(num_pieces * max_new, *q.shape[1:])
        return out.index_select(0, batch.output_index)

    def _piece_mask(self, window: int | None) -> torch.Tensor:
        """[P, 1, Lq, Lk]: key j is visible to a query at position p when j <= p (and p - j < window)."""
        mask = self._piece_masks.get(window)
        if mask is None:
            batch = self.meta.prefill_batch
            query = batch.query_positions[:, None, :, None]
            key = torch.arange(batch.key_slots.shape[1], device=query.device)[None, None, None, :]
            mask = key <= query
            if window is not None:
                mask &= key > query - window
            self._piece_masks[window] = mask
        return mask
