"""TorchCostModel: a step costs what executing it on the real engine takes, measured.

step_time = wall time of input preparation + upload + swaps/copies + forward + sampling, up to
the device finishing. `last_step_extras["gpu_time_s"]` is the device-side span between CUDA
events bracketing the launched work (on CPU the wall time again).
"""

from __future__ import annotations

import time

import torch

from backends.torch.engine import PagedEngine
from simcore.errors import ServesimError
from simcore.plan import StepPlan


class TorchCostModel:
    # The engine reads and writes the very blocks the policy allocates: ask for block tables.
    needs_block_tables = True

    def __init__(self, engine: PagedEngine, *, record_tokens: bool = False, describe: str = "") -> None:
        self.engine = engine
        self.device = engine.pool.device
        self.record_tokens = record_tokens
        # (step_id, request_id, token) for every newly selected token, when record_tokens.
        self.token_log: list[tuple[int, int, int]] = []
        self.last_step_extras: dict[str, float] = {}
        self._describe = describe  # named in out-of-memory errors

    def step_time(self, plan: StepPlan) -> float:
        cuda = self.device.type == "cuda"
        events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
        start = time.perf_counter()
        try:
            batch = self.engine.prepare(plan)
            new = self.engine.run(plan, batch, events)
            if cuda:
                torch.cuda.synchronize(self.device)
        except torch.OutOfMemoryError:
            raise ServesimError(
                f"out of device memory executing step {plan.step_id} ({plan.num_batched_tokens} tokens, "
                f"{len(plan.seqs)} requests) on {self._describe}; schedule fewer batched tokens"
            ) from None
        wall = time.perf_counter() - start
        gpu = events[0].elapsed_time(events[1]) / 1e3 if cuda else wall
        self.last_step_extras = {"gpu_time_s": gpu}
        if self.record_tokens:
            self.token_log.extend((plan.step_id, rid, tok) for rid, tok in new.items())
        return wall

    def output_token_ids(self, request_id: int) -> list[int]:
        return self.engine.output_token_ids(request_id)

    def recorded_tokens(self) -> dict[int, list[int]] | None:
        """Each request's selected tokens in order, from the log (None unless record_tokens).

        The hook the runner reads after a run to add `output_token_ids` to the requests table.
        The log, not the engine's token store, is the source: the store may forget a request."""
        if not self.record_tokens:
            return None
        tokens: dict[int, list[int]] = {}
        for _, request_id, token in self.token_log:
            tokens.setdefault(request_id, []).append(token)
        return tokens
