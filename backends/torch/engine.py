"""PagedEngine: executes StepPlans on a LlamaModel over a paged KV pool and selects tokens.

A step: swap-outs, swap-ins, copy-on-write copies (in that order: a swap-in may land in a block
a swap-out just vacated, and a copy may read a block just swapped in), then one forward pass
over every scheduled request's new tokens, lm_head over the selecting rows only, sampling.
"""

from __future__ import annotations

import torch

from backends.torch.attention import StepAttention, sdpa_backends
from backends.torch.inputs import StepBatch, TableCache, Uploader, build_batch
from backends.torch.kv_pool import KVPool
from backends.torch.model import LlamaModel
from backends.torch.sampling import SamplingParams, sample, uniforms
from backends.torch.tokens import TokenStore
from simcore.plan import ScheduledSeq, StepPlan

# Warm-up requests use ids no workload uses, and blocks past the simulator's range.
_WARMUP_ID = -(2**40)


class PagedEngine:
    def __init__(
        self, model: LlamaModel, pool: KVPool, decode_backend, *, sampling: SamplingParams | None = None,
        seed: int = 0,
    ) -> None:
        self.model, self.pool, self.decode_backend = model, pool, decode_backend
        self.sampling = sampling or SamplingParams()
        self.seed = seed
        self.tokens = TokenStore(model.spec.vocab_size, seed)
        self.uploader = Uploader(pool.device)
        self.tables = TableCache(pool.block_size)
        self.graphs = None  # a DecodeGraphs runner, when CUDA graphs are enabled
        # Tests and debugging: "selected" keeps each selecting row's logits, "all" every row's.
        self.keep_logits: str | None = None
        self.last_logits: dict[int, torch.Tensor] = {}
        self._block_limit = pool.num_blocks
        # cuDNN attention pays a plan build per new prompt shape (see attention.NO_CUDNN_SDPA); True
        # lets torch choose it anyway (benchmarks/gpu_check.py's prefill stage compares the two).
        self.allow_cudnn_attention = False

    # --- per-request state -------------------------------------------------------------------
    def output_token_ids(self, request_id: int) -> list[int]:
        """Outputs this engine selected for the request so far."""
        return self.tokens.outputs(request_id)

    def forget(self, request_id: int) -> None:
        self.tokens.forget(request_id)
        self.tables.forget(request_id)

    def set_outputs(self, request_id: int, prompt_len: int, tokens: list[int]) -> None:
        self.tokens.set_outputs(request_id, prompt_len, tokens)

    # --- steps -----------------------------------------------------------------------------
    def execute(self, plan: StepPlan) -> dict[int, int]:
        """Run one step; returns request_id -> newly selected token."""
        return self.run(plan, self.prepare(plan))

    def prepare(self, plan: StepPlan) -> StepBatch | None:
        """Host-side input preparation and the upload (no pool access)."""
        return build_batch(plan, self.tokens, self.tables, num_blocks=self._block_limit, uploader=self.uploader)

    @torch.inference_mode()
    def run(self, plan: StepPlan, batch: StepBatch | None,
            timing: tuple[torch.cuda.Event, torch.cuda.Event] | None = None) -> dict[int, int]:
        """Device work of a prepared step; `timing` events bracket it (CUDA)."""
        if timing is not None:
            timing[0].record()
        self.pool.swap_out(plan.blocks_to_swap_out)
        self.pool.swap_in(plan.blocks_to_swap_in)
        self.pool.copy_blocks(plan.blocks_to_copy)
        if batch is None:
            if timing is not None:
                timing[1].record()
            return {}
        logits = self._logits(batch)
        return self._select(batch, logits, timing)

    def _logits(self, batch: StepBatch) -> torch.Tensor | None:
        if self.graphs is not None and self.keep_logits is None and self.graphs.can_run(batch):
            return self.graphs.run(batch)
        attend = StepAttention(self.pool, batch.meta, self.decode_backend, self.model.spec)
        with sdpa_backends(self.pool.device, allow_cudnn=self.allow_cudnn_attention):
            hidden = self.model(batch.input_ids, batch.positions, attend)
        if self.keep_logits == "all":
            self._keep_all(batch, self.model.logits(hidden))
        if not batch.selecting:
            return None
        rows = hidden if batch.all_rows_select else hidden[batch.select_rows]
        return self.model.logits(rows)

    def _select(self, batch: StepBatch, logits: torch.Tensor | None, timing) -> dict[int, int]:
        if logits is None:
            if timing is not None:
                timing[1].record()
            return {}
        seqs = batch.selecting
        u = None
        if not self.sampling.greedy:
            # The draw for output k of a request is fixed by k, whatever batch or step selects it.
            indices = [self.tokens.num_outputs(s.request_id) for s in seqs]
            u = uniforms(self.seed, [s.request_id for s in seqs], indices)
        if self.keep_logits == "selected":
            self.last_logits = {s.request_id: logits[i:i + 1].cpu() for i, s in enumerate(seqs)}
        if timing is not None:
            timing[1].record()  # before the readback below, which waits for the device
        picked = sample(logits, self.sampling, u)
        new: dict[int, int] = {}
        for seq, token in zip(seqs, picked, strict=True):
            # Only a step that reaches the last known token selects a new one; a recompute
            # reaching an already selected output keeps it.
            if seq.end_len == self.tokens.num_known(seq.request_id):
                self.tokens.append(seq.request_id, token)
                new[seq.request_id] = token
        return new

    def _keep_all(self, batch: StepBatch, logits: torch.Tensor) -> None:
        self.last_logits, row = {}, 0
        for seq in batch.row_seqs:
            self.last_logits[seq.request_id] = logits[row: row + seq.num_new_tokens].cpu()
            row += seq.num_new_tokens

    # --- warm-up ---------------------------------------------------------------------------
    def warmup(self, rounds: int = 2) -> None:
        """Throwaway steps on scratch blocks and reserved ids: compile, autotune, allocate."""
        scratch = self.pool.scratch_block_ids
        bs = self.pool.block_size
        if len(scratch) < 5:
            return
        self._block_limit = self.pool.num_blocks + self.pool.num_scratch_blocks
        try:
            for r in range(rounds):
                a, b = _WARMUP_ID - 2 * r, _WARMUP_ID - 2 * r - 1
                table_a, table_b = tuple(scratch[0:2]) + (scratch[3],), (scratch[2], scratch[4])
                first = 2 * bs - 1
                self.execute(StepPlan(-1, (ScheduledSeq(a, first, 0, True, first, table_a),)))
                self.execute(StepPlan(-1, (
                    ScheduledSeq(a, 1, first, True, first, table_a),
                    ScheduledSeq(b, bs, 0, False, bs + 1, table_b),
                )))
                self.execute(StepPlan(-1, (
                    ScheduledSeq(b, 1, bs, True, bs + 1, table_b),
                    ScheduledSeq(a, 1, first + 1, True, first, table_a),
                )))
                if self.pool.num_host_blocks:
                    self.execute(StepPlan(-1, (), blocks_to_swap_out=((scratch[0], 0),)))
                    self.execute(StepPlan(-1, (), blocks_to_swap_in=((0, scratch[0]),)))
                self.forget(a)
                self.forget(b)
        finally:
            self._block_limit = self.pool.num_blocks
        if self.pool.device.type == "cuda":
            torch.cuda.synchronize(self.pool.device)
