"""Turning a StepPlan into device inputs: one flattened batch plus attention metadata.

All index arithmetic happens on the host in numpy (no device syncs), then every integer array
travels to the device in a single copy from a reused pinned buffer. Rows are reordered:
single-query rows first (they share the decode kernel, and their inputs are built with
vectorised numpy), multi-token pieces after. Converting block tables from tuples is the main
host cost of a large decode batch, so converted tables are cached per request and reused while
the plan's tuple is unchanged or only grew.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from backends.torch.attention import AttentionMetadata, PrefillBatch, PrefillPiece
from backends.torch.tokens import TokenStore
from simcore.plan import ScheduledSeq, StepPlan


@dataclass
class StepBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    # Rows whose logits select a token, and the seqs they belong to (same order).
    select_rows: torch.Tensor
    selecting: list[ScheduledSeq]
    num_tokens: int
    # Every scheduled seq in row order (single-query rows first).
    row_seqs: list[ScheduledSeq]

    @property
    def decode_only(self) -> bool:
        return not self.meta.prefills

    @property
    def all_rows_select(self) -> bool:
        return len(self.selecting) == self.num_tokens


class Uploader:
    """Packs int64 host arrays into one pinned buffer and copies them to the device at once."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pinned: torch.Tensor | None = None
        self._done: torch.cuda.Event | None = None

    def upload(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        packed = np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0, np.int64)
        host = torch.from_numpy(packed)
        if self.device.type == "cuda":
            if self._done is not None:
                self._done.synchronize()  # the previous upload may still be reading the buffer
            if self._pinned is None or self._pinned.numel() < host.numel():
                self._pinned = torch.empty(max(host.numel(), 1 << 16), dtype=torch.int64, pin_memory=True)
            staged = self._pinned[: host.numel()]
            staged.copy_(host)
            flat = staged.to(self.device, non_blocking=True)
            self._done = torch.cuda.Event()
            self._done.record()
        else:
            flat = host
        out, offset = [], 0
        for array in arrays:
            out.append(flat[offset: offset + array.size].view(array.shape))
            offset += array.size
        return out


class TableCache:
    """Block tables as validated int64 arrays, converted once per request and extended in place."""

    def __init__(self, block_size: int, max_entries: int = 8192) -> None:
        self.block_size = block_size
        self.max_entries = max_entries
        self._tables: OrderedDict[int, tuple[tuple[int, ...], np.ndarray]] = OrderedDict()

    def get(self, seq: ScheduledSeq, num_blocks: int) -> np.ndarray:
        """The blocks this step touches (logical 0 .. last needed), checked against the pool."""
        needed = -(-seq.end_len // self.block_size)
        table = seq.block_table
        if len(table) < needed:
            raise RuntimeError(
                f"request {seq.request_id}: block table has {len(table)} blocks, positions up to "
                f"{seq.end_len - 1} need {needed} (block size {self.block_size})"
            )
        table = table[:needed] if len(table) > needed else table
        cached = self._tables.get(seq.request_id)
        if cached is not None and cached[0] == table:
            self._tables.move_to_end(seq.request_id)
            return cached[1]
        old = cached[0] if cached is not None else ()
        if old and len(table) > len(old) and table[: len(old)] == old:
            array = np.concatenate([cached[1], self._convert(seq, table[len(old):], num_blocks)])
        else:
            array = self._convert(seq, table, num_blocks)
        self._tables[seq.request_id] = (table, array)
        self._tables.move_to_end(seq.request_id)
        if len(self._tables) > self.max_entries:
            self._tables.popitem(last=False)
        return array

    def forget(self, request_id: int) -> None:
        self._tables.pop(request_id, None)

    @staticmethod
    def _convert(seq: ScheduledSeq, blocks: tuple[int, ...], num_blocks: int) -> np.ndarray:
        array = np.fromiter(blocks, dtype=np.int64, count=len(blocks))
        if array.size and (array.min() < 0 or array.max() >= num_blocks):
            raise RuntimeError(f"request {seq.request_id}: block ids {list(blocks)} outside the pool [0, {num_blocks})")
        return array


def build_batch(plan: StepPlan, store: TokenStore, tables: TableCache, *, num_blocks: int,
                uploader: Uploader) -> StepBatch | None:
    if not plan.seqs:
        return None
    bs = tables.block_size
    singles = [s for s in plan.seqs if s.num_new_tokens == 1]
    multis = [s for s in plan.seqs if s.num_new_tokens > 1]
    ordered = singles + multis
    row_tables = [tables.get(seq, num_blocks) for seq in ordered]
    nd = len(singles)

    # Single-query rows, vectorised: one position each.
    ids_parts, pos_parts, slot_parts, extra = [], [], [], []
    if nd:
        d_pos = np.fromiter((s.context_len for s in singles), dtype=np.int64, count=nd)
        width = max(len(t) for t in row_tables[:nd])
        d_tables = np.zeros((nd, width), dtype=np.int64)
        for i, table in enumerate(row_tables[:nd]):
            d_tables[i, : len(table)] = table
        ids_parts.append(np.fromiter((store.token_at(s) for s in singles), dtype=np.int64, count=nd))
        pos_parts.append(d_pos)
        slot_parts.append(d_tables[np.arange(nd), d_pos // bs] * bs + d_pos % bs)
        extra += [d_tables, d_pos + 1]
    for seq, table in zip(multis, row_tables[nd:], strict=True):
        pos = np.arange(seq.context_len, seq.end_len, dtype=np.int64)
        ids_parts.append(store.input_ids(seq))
        pos_parts.append(pos)
        slot_parts.append(table[pos // bs] * bs + pos % bs)
    if multis:
        extra += _prefill_arrays(multis, row_tables[nd:], nd, bs)

    select_rows, selecting, row = [], [], 0
    for seq in ordered:
        row += seq.num_new_tokens
        if seq.selects_token:
            select_rows.append(row - 1)
            selecting.append(seq)
    ids = np.concatenate(ids_parts)
    arrays = [ids, np.concatenate(pos_parts), np.concatenate(slot_parts), np.asarray(select_rows, dtype=np.int64)]
    d_ids, d_pos, d_slots, d_select, *rest = uploader.upload(arrays + extra)
    rest = iter(rest)
    meta = AttentionMetadata(slot_mapping=d_slots, num_decode=nd)
    if nd:
        meta.decode_block_tables, meta.decode_seq_lens = next(rest), next(rest)
        meta.decode_max_len = max(s.end_len for s in singles)
    if multis:
        fresh_and_equal = all(s.context_len == 0 and s.num_new_tokens == multis[0].num_new_tokens for s in multis)
        meta.prefill_batch = PrefillBatch(*rest, fresh_and_equal=fresh_and_equal)
        start = nd
        for seq in multis:
            meta.prefills.append(PrefillPiece(start, seq.num_new_tokens, seq.context_len))
            start += seq.num_new_tokens
    return StepBatch(d_ids, d_pos, meta, d_select, selecting, int(ids.size), ordered)


def _prefill_arrays(pieces: list[ScheduledSeq], tables: list[np.ndarray], first_row: int,
                    block_size: int) -> list[np.ndarray]:
    """PrefillBatch's arrays (query rows, query positions, key slots, output index) for the pieces.

    Piece i is row i of a [pieces, max new tokens] query batch and of a [pieces, max end] key
    batch; padding queries repeat the piece's last query, padding keys read position 0's slot
    (the mask hides them either way).
    """
    num_new = np.fromiter((s.num_new_tokens for s in pieces), dtype=np.int64, count=len(pieces))
    context = np.fromiter((s.context_len for s in pieces), dtype=np.int64, count=len(pieces))
    starts = first_row + np.concatenate(([0], np.cumsum(num_new)[:-1]))
    offsets = np.minimum(np.arange(num_new.max(), dtype=np.int64)[None, :], (num_new - 1)[:, None])
    query_rows = starts[:, None] + offsets
    query_positions = context[:, None] + offsets
    max_end = int((context + num_new).max())
    key_slots = np.empty((len(pieces), max_end), dtype=np.int64)
    for i, (seq, table) in enumerate(zip(pieces, tables, strict=True)):
        keys = np.arange(seq.end_len, dtype=np.int64)
        key_slots[i, : seq.end_len] = table[keys // block_size] * block_size + keys % block_size
        key_slots[i, seq.end_len:] = table[0] * block_size
    width = query_rows.shape[1]
    output_index = np.concatenate([i * width + np.arange(n, dtype=np.int64) for i, n in enumerate(num_new)])
    return [query_rows, query_positions, key_slots, output_index]
