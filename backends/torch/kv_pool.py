"""The physical KV pool: fixed-size blocks on the device, a host tier for swaps, block copies.

One tensor [layers, 2 (K, V), blocks, block_size, H_KV, d_head] so each layer's K (or V) is a
contiguous [blocks, block_size, H_KV, d_head] view (a flat [slots, H_KV, d_head] view for writes
and flex attention), and copy-on-write / swaps move one block across every layer in one
indexed op. Blocks past `num_blocks` are scratch space for warm-up and padded CUDA-graph rows;
the simulator's block ids never reach them.
"""

from __future__ import annotations

import torch

from simcore.errors import ServesimError


class KVPool:
    def __init__(
        self, *, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype, device: torch.device, num_host_blocks: int = 0, num_scratch_blocks: int = 8,
    ) -> None:
        self.num_blocks = num_blocks
        self.num_scratch_blocks = num_scratch_blocks
        self.block_size = block_size
        self.num_host_blocks = num_host_blocks
        self.device = device
        shape = (num_layers, 2, num_blocks + num_scratch_blocks, block_size, num_kv_heads, head_dim)
        # Zeros, not empty: profiling reads never-written context, and NaN garbage could change
        # kernel speed on some hardware.
        self.kv = torch.zeros(shape, dtype=dtype, device=device)
        host_shape = (num_layers, 2, num_host_blocks, block_size, num_kv_heads, head_dim)
        pin = device.type == "cuda"
        self.host = torch.zeros(host_shape, dtype=dtype, pin_memory=pin) if num_host_blocks else None
        self._staging: torch.Tensor | None = None  # pinned bounce buffer for swaps
        self._staging_done: torch.cuda.Event | None = None

    @property
    def scratch_block_ids(self) -> list[int]:
        return list(range(self.num_blocks, self.num_blocks + self.num_scratch_blocks))

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's K and V caches, each [blocks, block_size, H_KV, d_head]."""
        return self.kv[index, 0], self.kv[index, 1]

    def block_bytes(self) -> int:
        """Bytes of one block across all layers, K and V (what one swap moves)."""
        return self.kv[:, :, 0].numel() * self.kv.element_size()

    def copy_blocks(self, pairs: tuple[tuple[int, int], ...]) -> None:
        """Copy-on-write: dst <- src for each pair, every layer, before the step writes."""
        if not pairs:
            return
        src, dst = self._ids(pairs, 0), self._ids(pairs, 1)
        self.kv.index_copy_(2, dst, self.kv.index_select(2, src))

    def swap_out(self, pairs: tuple[tuple[int, int], ...]) -> None:
        """(device block, host block) pairs: device -> host."""
        if not pairs:
            return
        host = self._need_host(pairs)
        dev = self._ids(pairs, 0)
        dst = torch.tensor([h for _, h in pairs], dtype=torch.int64)
        self._check_range(dst, self.num_host_blocks, "host")
        gathered = self.kv.index_select(2, dev)
        if self.device.type == "cuda":
            staging = self._stage(gathered.shape)
            staging.copy_(gathered, non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()  # the host scatter below reads it
            gathered = staging
        host.index_copy_(2, dst, gathered)

    def swap_in(self, pairs: tuple[tuple[int, int], ...]) -> None:
        """(host block, device block) pairs: host -> device."""
        if not pairs:
            return
        host = self._need_host(pairs)
        src = torch.tensor([h for h, _ in pairs], dtype=torch.int64)
        self._check_range(src, self.num_host_blocks, "host")
        dev = self._ids(pairs, 1)
        if self.device.type == "cuda":
            shape = (host.shape[0], 2, len(pairs), *host.shape[3:])
            staging = self._stage(shape)
            torch.index_select(host, 2, src, out=staging)
            moved = staging.to(self.device, non_blocking=True)
            self._staging_done = torch.cuda.Event()
            self._staging_done.record()
        else:
            moved = host.index_select(2, src)
        self.kv.index_copy_(2, dev, moved)

    def _stage(self, shape: tuple[int, ...]) -> torch.Tensor:
        # One growing pinned buffer: pinning per call costs milliseconds.
        if self._staging_done is not None:
            self._staging_done.synchronize()  # an earlier non-blocking upload may still read it
            self._staging_done = None
        numel = 1
        for n in shape:
            numel *= n
        if self._staging is None or self._staging.numel() < numel:
            self._staging = torch.empty(numel, dtype=self.kv.dtype, pin_memory=True)
        return self._staging[:numel].view(shape)

    def _need_host(self, pairs: tuple) -> torch.Tensor:
        if self.host is None:
            raise ServesimError(f"the step swaps {len(pairs)} blocks but the torch backend has no host blocks "
                                "(num_host_blocks is 0)")
        return self.host

    def _ids(self, pairs: tuple, column: int) -> torch.Tensor:
        ids = torch.tensor([p[column] for p in pairs], dtype=torch.int64)
        # Scratch blocks count as valid here so warm-up can exercise swaps; block tables are
        # checked against the simulator's range when a step is prepared.
        self._check_range(ids, self.num_blocks + self.num_scratch_blocks, "device")
        return ids.to(self.device)

    @staticmethod
    def _check_range(ids: torch.Tensor, limit: int, tier: str) -> None:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= limit):
            raise RuntimeError(f"{tier} block id out of range [0, {limit}): {ids.tolist()}")
