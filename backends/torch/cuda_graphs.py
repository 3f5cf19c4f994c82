"""CUDA graphs for decode-only steps: one captured forward per padded batch-size bucket.

A decode step of a small model is dominated by kernel launches; replaying a graph removes them.
Each bucket owns a graph over static input buffers; a step of n rows uses the smallest bucket
>= n, fills rows n.. with padding that writes its K/V into a scratch slot and attends to one
key, replays, and reads the first n rows of logits. Only the Triton decode path is captured
(its split count is fixed per bucket, so the grid is static). Steps that do not fit a bucket,
have prefill pieces, or rows that do not select run eagerly.
"""

from __future__ import annotations

import torch

from backends.torch.attention import AttentionMetadata, StepAttention
from backends.torch.inputs import StepBatch
from backends.torch.kv_pool import KVPool
from backends.torch.model import LlamaModel
from backends.torch.triton_decode import MAX_SPLITS, TritonDecode, choose_splits


def bucket_sizes(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b <= max_batch]
    sizes += list(range(16, max_batch + 1, 16))
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


class DecodeGraphs:
    def __init__(self, model: LlamaModel, pool: KVPool, *, max_batch: int = 256, max_context: int | None = None) -> None:
        self.model, self.pool = model, pool
        device = pool.device
        bs = pool.block_size
        max_context = max_context or model.spec.max_position_embeddings
        self.max_blocks = min(pool.num_blocks, -(-max_context // bs))
        self.sizes = bucket_sizes(max_batch)
        m = self.sizes[-1]
        self.scratch_block = pool.scratch_block_ids[-1]
        self.input_ids = torch.zeros(m, dtype=torch.int64, device=device)
        self.positions = torch.zeros(m, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((m,), self.scratch_block * bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(m, dtype=torch.int64, device=device)
        self.block_tables = torch.full((m, self.max_blocks), self.scratch_block, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    def _forward(self, size: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], num_decode=size,
            decode_block_tables=self.block_tables[:size], decode_seq_lens=self.seq_lens[:size],
        )
        # A split count that suits long contexts; short rows leave their extra splits empty.
        splits = choose_splits(size, self.model.spec.num_kv_heads, MAX_SPLITS * 1024)
        attend = StepAttention(self.pool, meta, TritonDecode(fixed_splits=splits), self.model.spec)
        hidden = self.model(self.input_ids[:size], self.positions[:size], attend)
        return self.model.logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        memory_pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for size in reversed(self.sizes):  # compile and allocate outside capture
                self._forward(size)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        for size in reversed(self.sizes):  # largest first: later graphs reuse its memory
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=memory_pool):
                self.logits[size] = self._forward(size)
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def can_run(self, batch: StepBatch) -> bool:
        meta = batch.meta
        return (
            batch.decode_only and batch.all_rows_select and bool(self.graphs)
            and meta.num_decode <= self.sizes[-1] and meta.decode_block_tables.shape[1] <= self.max_blocks
        )

    def run(self, batch: StepBatch) -> torch.Tensor:
        meta = batch.meta
        n, width = meta.num_decode, meta.decode_block_tables.shape[1]
        size = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.seq_lens[:n].copy_(meta.decode_seq_lens)
        self.block_tables[:n, :width].copy_(meta.decode_block_tables)
        if size > n:  # padding rows: one key in the scratch block
            self.input_ids[n:size].zero_()
            self.positions[n:size].zero_()
            self.slot_mapping[n:size].fill_(self.scratch_block * self.pool.block_size)
            self.seq_lens[n:size].fill_(1)
            self.block_tables[n:size, 0].fill_(self.scratch_block)
        self.graphs[size].replay()
        return self.logits[size][:n]
