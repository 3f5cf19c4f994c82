"""Static batching: a group runs until every member is done; newcomers wait for the next group.

Finished rows stop computing but their slots stay unused until the whole group completes
(head-of-line blocking, seed 21.3). Each member reserves its prompt + outputs up front, as a
static engine preallocates; with `padded: true` every member reserves the group's longest
length and keeps it until the group is done, so the rectangular padding counts as storage
(seed 21.1). Padding is storage only here: attention cost still follows each row's own length.

A group runs whole, with every block reserved up front, and never preempts: the step scheduler's
options (token budget, seats, admission, preemption) and a prefix cache play no part. The
experiment file refuses them for a static entry (`experiments.config`); here they are accepted
and unused, so that code driving every policy with the same options can include this one.
"""

from __future__ import annotations

from policies.base import Scheduler
from simcore.plan import StepPlan
from simcore.request import Request, Status


class StaticPolicy(Scheduler):
    accelerable = True
    name = "static"

    def __init__(self, *args, max_batch_size: int = 32, padded: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.max_batch_size = max_batch_size
        self.padded = padded
        # Padded rows keep their rectangle until the whole group is done.
        self._held: list[int] = []

    def fill(self, now: float) -> None:
        if not self.running:
            for request_id in self._held:
                self.bm.free(request_id)
            self._held.clear()
            self._form_group(now)
            return
        for request in self.running:
            self._run(request, request.num_pending)

    def only_continues_next(self, plan: StepPlan, finished: list[Request]) -> bool:
        return True  # the group runs whole, with no budget; newcomers wait until it is done

    def arrival_waits(self, request: Request) -> bool:
        return True

    def runs_past_finishes(self) -> bool:
        # Nothing is admitted before the group is done; padded rows keep their blocks.
        return not self.padded and not self.bm.tracks_block_ids

    def _release_blocks(self, request: Request) -> None:
        if self.padded:
            self._held.append(request.request_id)
        else:
            self.bm.free(request.request_id)

    def _form_group(self, now: float) -> None:
        candidates = list(self.waiting)[: self.max_batch_size]
        while candidates and not self._fits(candidates):
            candidates.pop()
        if not candidates:
            return
        reserve = self._reserve_positions(candidates)
        for request in candidates:
            self.waiting.remove(request)
            self.bm.allocate(request.request_id, reserve or request.num_final_positions)
            request.first_scheduled_s = request.first_scheduled_s if request.first_scheduled_s is not None else now
            request.status = Status.RUNNING
            self.running.append(request)
            self._builder.admitted.append(request.request_id)  # type: ignore[union-attr]
            self._run(request, request.num_pending)

    def _reserve_positions(self, group: list[Request]) -> int:
        return max(r.num_final_positions for r in group) if self.padded else 0

    def _fits(self, group: list[Request]) -> bool:
        reserve = self._reserve_positions(group)
        need = sum(self.bm.blocks_for(reserve or r.num_final_positions) for r in group)
        return self.bm.can_allocate(need)
