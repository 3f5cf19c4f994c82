"""Decode attention through FlexAttention, reading the pool in place with a paged block mask.

The pool of one layer is presented as a single key sequence of every slot [1, H_KV, slots, d]
shared by all rows (batch-broadcast K/V). Each row's BlockMask lists its physical blocks (the
mask's KV block size is the pool's block size), and the mask_mod maps a physical slot back to
the row's logical position through a per-step physical->logical table to hide the tail of the
last block.

On CUDA the kernel is compiled with static shapes (flex's decoding lowering needs a concrete
batch size), so rows are padded to a power of two and block tables to a fixed width: one
compile per batch bucket, paid by the first step that uses it. Elsewhere eager flex runs
(unfused and slow; CPU tests use it to check the masking logic).
"""

from __future__ import annotations

import inspect

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from backends.torch.attention import AttentionMetadata

# Decoding needs no query-major (backward) indices; skipping them also lets the index tensors
# be as wide as the longest table instead of the whole pool. Older torch lacks the switch.
_NO_Q_BLOCKS = {"compute_q_blocks": False} if "compute_q_blocks" in inspect.signature(
    BlockMask.from_kv_blocks).parameters else {}
# Batch buckets compile separately; keep dynamo from giving up on them.
_MIN_RECOMPILE_LIMIT = 32


def _next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class FlexDecode:
    name = "flex"

    def __init__(self, compiled: bool, max_blocks_per_seq: int | None = None, pad: bool | None = None) -> None:
        self.compiled = compiled
        self.pad = compiled if pad is None else pad  # tests pad eagerly to check the padded layout
        self.max_blocks_per_seq = max_blocks_per_seq
        if compiled:
            import torch._dynamo.config as dynamo_config

            for knob in ("recompile_limit", "cache_size_limit"):
                if hasattr(dynamo_config, knob):
                    setattr(dynamo_config, knob, max(getattr(dynamo_config, knob), _MIN_RECOMPILE_LIMIT))
            self._attend = torch.compile(flex_attention, dynamic=False)
        else:
            self._attend = flex_attention

    def begin_step(self, meta: AttentionMetadata) -> None:
        # Built lazily at the first layer, where the pool's geometry is known.
        meta.backend_state = None

    def _padded(self, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        tables, seq_lens = meta.decode_block_tables, meta.decode_seq_lens
        rows, width = tables.shape
        if not self.pad:
            return tables, seq_lens
        padded_rows = _next_power_of_two(rows)
        padded_width = max(self.max_blocks_per_seq or width, width)
        out_tables = tables.new_zeros((padded_rows, padded_width))
        out_tables[:rows, :width] = tables
        # Padding rows read one key (block 0, slot 0); their outputs are dropped.
        out_lens = seq_lens.new_ones(padded_rows)
        out_lens[:rows] = seq_lens
        return out_tables, out_lens

    def _block_mask(self, tables: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int, block_size: int) -> BlockMask:
        rows, width = tables.shape
        device = tables.device
        used = (seq_lens + block_size - 1) // block_size  # blocks each row reads
        logical = torch.arange(width, device=device).expand(rows, -1)
        # Table entries past a row's used blocks are never visited; park them on a spare
        # column so they cannot overwrite a real entry of the inverse table.
        valid = logical < used[:, None]
        phys = torch.where(valid, tables, num_blocks)
        to_logical = torch.full((rows, num_blocks + 1), -1, dtype=torch.int64, device=device)
        to_logical.scatter_(1, phys, torch.where(valid, logical, -1))

        def mask_mod(b, h, q_idx, kv_idx):
            lblock = to_logical[b, kv_idx // block_size]
            return (lblock >= 0) & (lblock * block_size + kv_idx % block_size < seq_lens[b])

        return BlockMask.from_kv_blocks(
            used.view(rows, 1, 1).to(torch.int32), phys.view(rows, 1, 1, width).to(torch.int32),
            BLOCK_SIZE=(128, block_size), mask_mod=mask_mod, seq_lengths=(1, num_blocks * block_size),
            **_NO_Q_BLOCKS,
        )

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata, scale: float) -> torch.Tensor:
        num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
        if meta.backend_state is None:
            tables, seq_lens = self._padded(meta)
            meta.backend_state = self._block_mask(tables, seq_lens, num_blocks, block_size)
        block_mask = meta.backend_state
        rows = q.shape[0]
        padded_rows = block_mask.kv_num_blocks.shape[0]
        if padded_rows > rows:
            q = torch.cat([q, q.new_zeros((padded_rows - rows, *q.shape[1:]))])
        keys = k_cache.view(1, num_blocks * block_size, num_kv_heads, head_dim).transpose(1, 2)
        values = v_cache.view(1, num_blocks * block_size, num_kv_heads, head_dim).transpose(1, 2)
        out = self._attend(q[:, :, None, :], keys, values, block_mask=block_mask, scale=scale, enable_gqa=True)
        return out[:rows, :, 0, :]
