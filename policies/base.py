"""The scheduler every policy is: queues, blocks, and each scheduling rule written once.

A policy is synchronous and contains no SimPy. The engine calls `add()` on arrival,
`schedule(now)` for the next `StepPlan`, and `complete(plan, now)` once the step's time has
passed. A policy subclass writes only `fill`: the order in which a step takes its work (the
running decodes, prompts in progress, swapped-out requests, the queue), each by the rules
below. Each request simply catches its processed count up to its known tokens (vLLM v1's
view): there is no separate prefill or decode phase, so chunked prefill, prefix hits and
recompute after preemption all fall out of the same counters.

Three small predicates tell an accelerator (`policies.accelerate`) when the next steps are
certain without planning each: `only_continues_next`, `arrival_waits` and `runs_past_finishes`
(see docs/policies.md, "Writing a policy").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Literal

from policies.budget import StepBudget
from policies.host_pool import HostPool
from policies.prefix_reuse import NO_HIT, PrefixReuse
from policies.queues import WaitingQueue, make_order
from policies.tally import Tally
from simcore.block_manager import BlockManager, PrefixHit
from simcore.itl import ItlLog
from simcore.plan import NO_BLOCK_ID, NO_DECODES, Decodes, ScheduledSeq, StepPlan
from simcore.prefix import PrefixHasher
from simcore.request import Request, Status

Admission = Literal["optimistic", "prompt", "reserve", "watermark", "conservative"]
# Conservative admission counts at most this many outputs still to come of each request
# (SGLang's CLIP_MAX_NEW_TOKENS_ESTIMATION, python/sglang/srt/managers/schedule_policy.py).
MAX_RESERVED_OUTPUTS = 4096
# Steps' worth of outputs a re-estimate after a preemption adds for each running request
# (SGLang's retract_decode_steps, python/sglang/global_config.py).
RETRACT_DECODE_STEPS = 20
Preemption = Literal["recompute", "swap"]


@dataclass
class SchedulerOptions:
    # Most requests running at once (vLLM max_num_seqs).
    max_num_seqs: int = 256
    # Most positions processed in one step, prefill and decode together.
    max_num_batched_tokens: int = 8192
    # How admission accounts for future KV growth (seed 21.3): allocate as you go and preempt
    # when out (optimistic), keep a fraction of blocks free for running requests (watermark),
    # allocate the whole prompt's blocks at once (prompt: vLLM v0's block manager, also under
    # chunked prefill), or reserve prompt + outputs up front (reserve; uses max_tokens when set,
    # else the workload's output length, which a real server would not know: an upper bound on
    # its caution), or keep room for a share of every request's outputs still to come that
    # starts cautious and relaxes step by step (conservative: SGLang's new_token_ratio).
    admission: Admission = "optimistic"
    watermark: float = 0.01
    # Conservative admission's share: new_token_ratio at first and after the batch empties, down
    # to min_new_token_ratio over new_token_ratio_decay_steps steps (SGLang's defaults: 0.7,
    # 0.7 x 0.14 and 600; python/sglang/global_config.py).
    new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.098
    new_token_ratio_decay_steps: int = 600
    # What happens to a victim's KV under memory pressure: discard and recompute, or swap to host.
    preemption: Preemption = "recompute"
    # Longest prompt + output a request may have; longer ones are rejected with a reason. None
    # is no limit; an experiment always sets one (the model's context length by default).
    max_model_len: int | None = None
    # Selection/delivery time added after the step that selects an output (TTFT's third term).
    delivery_s: float = 0.0
    # The order admission takes waiting requests in (policies.queues).
    queue_order: str = "fcfs"
    # Steps a schedule runs for (vLLM 0.6's multi-step scheduling): after a step the scheduler
    # planned, up to num_scheduler_steps - 1 more steps decode the same batch with no scheduler
    # pass (no admission, no CPU scheduling time), and the group's outputs reach their clients
    # together when it ends (docs/policies.md, "Multi-step scheduling").
    num_scheduler_steps: int = 1


def _nothing(request: Request) -> tuple:
    return ()


class PlanBuilder:
    """The plan of the step being scheduled, as the rules add to it."""

    __slots__ = ("decodes", "seqs", "copies", "swap_out", "swap_in", "preempted", "admitted", "scheduled",
                 "pinned_host")

    def __init__(self) -> None:
        # A batch of decodes taken at once (`schedule_decodes`), as columns, then sequences one by one.
        self.decodes = NO_DECODES
        self.seqs: list[ScheduledSeq] = []
        self.copies: list[tuple[int, int]] = []
        self.swap_out: list[tuple[int, int]] = []
        self.swap_in: list[tuple[int, int]] = []
        self.preempted: list[int] = []
        self.admitted: list[int] = []
        # Requests already in the step (a victim is never one of them).
        self.scheduled: set[int] = set()
        # Host blocks read by this plan's swap-ins: not to be overwritten by its swap-outs.
        self.pinned_host: set[int] = set()

    @property
    def has_seqs(self) -> bool:
        """Whether anything runs in the step so far."""
        return bool(self.seqs or self.decodes.request_ids)


class Scheduler:
    name = "base"
    # Whether this class's own `fill` is what the predicates below (what accelerators ask)
    # describe. The generic accelerator takes runs only of a policy whose `fill` comes from a
    # class that says so: a subclass that writes its own `fill` says it again, or is stepped.
    accelerable = False

    def __init__(
        self,
        options: SchedulerOptions,
        block_manager: BlockManager,
        *,
        hasher: PrefixHasher | None = None,
        host: HostPool | None = None,
        emit_block_tables: bool = False,
        block_bytes: int = 0,
    ) -> None:
        if options.preemption == "swap" and host is None:
            raise ValueError("preemption 'swap' needs a host tier (kv_cache.host_memory_gib > 0)")
        self.options = options
        self.bm = block_manager
        self.host = host
        # Each plan's sequences carry their block tables (a real engine reads them).
        self.emit_block_tables = emit_block_tables
        # Bytes a KV block holds (a swap's link time).
        self.block_bytes = block_bytes
        self.waiting = WaitingQueue(make_order(options.queue_order, prefix_caching=block_manager.enable_prefix_caching))
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.finished: list[Request] = []
        self.rejected: list[Request] = []
        self.timed_out: list[Request] = []
        self.by_id: dict[int, Request] = {}
        self.num_steps = 0
        self.itl = ItlLog()
        self.num_resident_tokens = 0
        self.tally = Tally()
        self.prefix = PrefixReuse(block_manager, hasher, host, self.tally)
        # Admissions count the positions they query the prefix cache for (vLLM's convention):
        # where it is on, or where it is asked for but could never hit (see the runner).
        self.counts_prefix_queries = block_manager.enable_prefix_caching
        # Request id -> (when it was preempted, its processed positions then, "swap"/"recompute"):
        # the delay until it is back there is charged to it.
        self.preempted_at: dict[int, tuple[float, int, str]] = {}
        # Finished requests keep their blocks until `release_held` (set by a disaggregated
        # cluster on its prefill replicas: the KV stays until it has crossed the link).
        self.holds_finished_blocks = False
        # Conservative admission's share of outputs kept room for: its value and the step it
        # was set at (it falls linearly from there: `new_token_ratio`).
        self._ratio_set = (options.new_token_ratio, 0)
        # A multi-step group under way: steps still to come after the last one completed, the
        # outputs each request has made in it that no client has seen (request id -> request,
        # count), and requests with all their outputs that leave when it ends.
        self._group_steps_left = 0
        self._burst: dict[int, tuple[Request, int]] = {}
        self._finishing: list[Request] = []
        self._now = 0.0
        self._builder: PlanBuilder | None = None

    # ---- the engine's calls ---------------------------------------------------------------

    def add(self, request: Request, now: float) -> None:
        """A request arrives: queue it, or reject it with a reason if it can never run."""
        reason = self.rejection_reason(request)
        if reason is not None:
            request.status = Status.REJECTED
            request.reject_reason = reason
            request.finish_s = now
            self.rejected.append(request)
            return
        request.status = Status.WAITING
        self.by_id[request.request_id] = request
        self.waiting.add(request)

    def schedule(self, now: float) -> StepPlan | None:
        """The next step's plan, or None when nothing can run until something arrives."""
        self._now = now
        if self._group_steps_left:
            return self._continue_group()
        if not self.running:  # an empty batch starts cautious again
            self._ratio_set = (self.options.new_token_ratio, self.num_steps)
        self.waiting.sort_by_prefix(self.cached_prefix_positions)
        self._begin_plan()
        self.fill(now)
        builder = self._builder
        while not builder.has_seqs and not builder.swap_out and builder.preempted:
            # Preempting freed blocks but nothing ran: plan again with the room now available.
            preempted = builder.preempted
            builder = self._begin_plan()
            builder.preempted.extend(preempted)
            self.fill(now)
            if builder.preempted == preempted and not builder.has_seqs:
                break
        return self._end_plan()

    def fill(self, now: float) -> None:
        """Put this step's work into the plan being built: the policy's own order of work."""
        raise NotImplementedError

    def complete(self, plan: StepPlan, now: float) -> list[Request]:
        """The step ended at `now`: advance every scheduled request by its processed positions,
        select outputs, retire the finished (returned)."""
        by_id, prefix, preempted_at = self.by_id, self.prefix, self.preempted_at
        decoded = [by_id[request_id] for request_id in plan.decodes.request_ids]
        for request in decoded:
            request.num_processed += 1
        listed = [by_id[seq.request_id] for seq in plan.listed]
        for request, seq in zip(listed, plan.listed):
            request.num_processed += seq.num_new_tokens
        if prefix.enabled or preempted_at:
            # In batch order: of two equal blocks filled in one step, the cache keeps the first.
            num_new = [*repeat(1, len(decoded)), *(seq.num_new_tokens for seq in plan.listed)]
            for request, count in zip([*decoded, *listed], num_new):
                if prefix.enabled:
                    prefix.register_full_blocks(request, request.num_processed - count)
                if preempted_at and request.request_id in preempted_at:
                    self.note_resumed(request, now)
        self.num_resident_tokens += plan.num_batched_tokens
        selecting = [*decoded, *(request for request, seq in zip(listed, plan.listed) if seq.selects_token)]
        if self.options.num_scheduler_steps > 1:
            return self._complete_in_group(plan, selecting, now)
        gaps = self.select_outputs(selecting, now)
        if gaps:
            self.itl.add_gaps(gaps)
        done = [request for request in selecting if request.num_outputs >= request.num_target_outputs]
        for request in done:
            self.finish(request, now + self.options.delivery_s)
        return done

    def has_work(self) -> bool:
        """Whether anything is queued, running or swapped out."""
        return bool(self.waiting or self.running or self.swapped)

    # ---- multi-step scheduling (num_scheduler_steps > 1) -------------------------------------

    def _complete_in_group(self, plan: StepPlan, selecting: list[Request], now: float) -> list[Request]:
        """A step of a multi-step group ended at `now` (its positions advanced): its outputs are
        made but not delivered; a request with all of them stops running and leaves when the
        group ends (vLLM 0.6 frees it when it processes the group's outputs). The group goes on
        while steps are left and its decodes can all run (`_group_decoders`); else it ends now:
        the burst is delivered and the requests that finished leave (returned)."""
        self._make_outputs(selecting, now)
        for request in selecting:
            made = self._burst.get(request.request_id)
            self._burst[request.request_id] = (request, made[1] + 1 if made else 1)
            if request.num_outputs >= request.num_target_outputs:
                self._off_the_batch(request)
                self._finishing.append(request)
        self._group_steps_left = self._steps_left_after(plan)
        if self._group_steps_left and self._group_decoders() is not None:
            return []
        self._group_steps_left = 0
        burst, self._burst = list(self._burst.values()), {}
        gaps = self._deliver([request for request, _ in burst], now, [count for _, count in burst])
        if gaps:
            self.itl.add_gaps(gaps)
        done, self._finishing = self._finishing, []
        for request in done:
            self._release_blocks(request)
            self._leave(request, Status.FINISHED, now + self.options.delivery_s, self.finished)
        return done

    def _steps_left_after(self, plan: StepPlan) -> int:
        """Steps still to come in the group of `plan`: a step the scheduler planned starts a group
        of num_scheduler_steps, but one that only prefills whole prompts runs alone (vLLM 0.6
        gives a prefill batch lookahead slots only where it chunks prompts)."""
        if not plan.group_step and self.admits_whole_prompts and not plan.num_decode_tokens:
            return 0
        return self.options.num_scheduler_steps - 1 - plan.group_step

    def _group_decoders(self) -> list[Request] | None:
        """The running requests a group's next step decodes (those past their prompts: a prompt
        in progress waits for the next schedule, as in vLLM's multi-step chunked prefill), or
        None where that step cannot run: nothing to decode, more than a step's budget, or
        too few free blocks (the group ends early then, rather than preempt in it)."""
        decoders = [request for request in self.running if not request.is_prefilling]
        if not decoders or len(decoders) > min(self.options.max_num_batched_tokens, self.options.max_num_seqs):
            return None
        ids = [request.request_id for request in decoders]
        return decoders if self.bm.max_decode_steps(ids, 1) == 1 else None

    def _continue_group(self) -> StepPlan | None:
        """A group's next step: the same batch decodes again, planned by no scheduler pass."""
        decoders = self._group_decoders()
        assert decoders is not None, "a group goes on only where its next step can run"
        self._begin_plan()
        self.schedule_decodes(decoders, StepBudget(len(decoders), len(decoders)))
        return self._end_plan(group_step=self.options.num_scheduler_steps - self._group_steps_left)

    # ---- what accelerators ask (docs/policies.md, "Writing a policy") ---------------------
    # Each a claim about `fill`; the equivalence tests (tests/test_accelerate.py) check them.

    def only_continues_next(self, plan: StepPlan, finished: list[Request]) -> bool:
        """Whether the step after `plan` (completed, `finished` leaving in it), if no request is
        delivered before it and its blocks suffice, only continues the running requests, each
        of them (a decode, or a prompt's next chunk): it has budget for every decode, and starts
        nothing (admits no waiting request, resumes no swapped one) because nothing waits or is
        swapped out, or because `plan` only decoded every running request and none finished, so
        its admission and swap-in found too little room (seats, budget, blocks), which the next
        step has no more of. Not with a prefix cache while requests wait: blocks the decodes
        fill can give the queue new hits."""
        if len(self.running) > min(self.options.max_num_batched_tokens, self.options.max_num_seqs):
            return False
        if not self.waiting and not self.swapped:
            return True
        if self.prefix.enabled or finished or self.options.admission == "conservative":
            # (Conservative admission relaxes step by step: a waiting request may start at any.)
            return False
        return plan.num_decode_tokens == plan.num_seqs == len(self.running) and not plan.admitted_ids \
            and not plan.preempted_ids and not plan.blocks_to_swap_in

    def arrival_waits(self, request: Request) -> bool:
        """Whether `request`, arriving now, could not start before a running request finishes
        while the batch only decodes (after a step that admitted nothing): no seat is free, or
        it would queue behind a head admission is stuck at (admission keeps the queue's order
        and stops at the first request it cannot take), or behind a swapped-out request, which
        comes back before any admission."""
        if len(self.running) >= self.options.max_num_seqs or self.swapped:
            return True
        if self.options.admission == "conservative":
            return False  # the room it keeps shrinks step by step: the head may start at any
        return bool(self.waiting) and not self.waiting.would_lead(request)

    def runs_past_finishes(self) -> bool:
        """Whether a running request's finish changes nothing for the others but the batch size:
        nothing waits for the seat and blocks it frees, and blocks are counted, not named (a
        freed block's id would change which block the next decode takes)."""
        return not self.bm.tracks_block_ids and not self.waiting and not self.swapped

    # ---- rules: what can run at all --------------------------------------------------------

    def rejection_reason(self, request: Request) -> str | None:
        """Why a request can never run under this configuration, or None."""
        total = request.prompt_len + request.num_target_outputs
        if self.options.max_model_len is not None and total > self.options.max_model_len:
            return f"prompt + output = {total} tokens exceeds max_model_len {self.options.max_model_len}"
        need = self.bm.blocks_for(request.num_final_positions)
        if need > self.bm.num_blocks:
            return (
                f"needs {need} KV blocks for {request.num_final_positions} positions; "
                f"the whole cache has {self.bm.num_blocks}"
            )
        reserve = self.num_watermark_blocks()
        # The prompt's blocks matter only where a watermark is kept (every arrival comes here).
        if reserve and (prompt_blocks := self.bm.blocks_for(request.prompt_len)) > self.bm.num_blocks - reserve:
            # Admission keeps the watermark free, so this prompt could never be admitted (vLLM
            # rejects it the same way).
            return (
                f"its prompt needs {prompt_blocks} KV blocks; the watermark keeps {reserve} of the "
                f"{self.bm.num_blocks} blocks free, leaving {self.bm.num_blocks - reserve}"
            )
        return None

    def readmission_reason(self, request: Request) -> str | None:
        """Why `request`, once preempted, could never be admitted again (or swapped back in), or
        None: its prompt and outputs so far need more blocks than the watermark leaves (the rule
        `rejection_reason` applies to a prompt on arrival; vLLM's can_allocate says NEVER)."""
        reserve = self.num_watermark_blocks()
        need = self.bm.blocks_for(request.num_tokens)
        if not reserve or need <= self.bm.num_blocks - reserve:
            return None
        return (
            f"preempted with {request.num_tokens} positions (prompt and {request.num_outputs} "
            f"outputs), which need {need} KV blocks; the watermark keeps {reserve} of the "
            f"{self.bm.num_blocks} blocks free, leaving {self.bm.num_blocks - reserve}"
        )

    def num_watermark_blocks(self) -> int:
        """Blocks admission keeps free for running requests to grow into."""
        if self.options.admission != "watermark":
            return 0
        return int(self.options.watermark * self.bm.num_blocks)

    def new_token_ratio(self) -> float:
        """Conservative admission's share of the outputs to come that it keeps room for now:
        falling linearly from where it was last set, to its floor."""
        options = self.options
        ratio, since = self._ratio_set
        fall = (options.new_token_ratio - options.min_new_token_ratio) / options.new_token_ratio_decay_steps
        return max(ratio - fall * (self.num_steps - since), options.min_new_token_ratio)

    def num_output_reserve_blocks(self, request: Request) -> int:
        """Blocks conservative admission keeps free, besides those `request` takes now: room for
        `new_token_ratio` of the outputs still to come of every running request and of
        `request` (each at most MAX_RESERVED_OUTPUTS); none under the other admissions."""
        if self.options.admission != "conservative":
            return 0
        to_come = sum(min(max(r.num_final_positions - r.num_tokens, 0), MAX_RESERVED_OUTPUTS)
                      for r in (*self.running, request))
        return -(-int(self.new_token_ratio() * to_come) // self.bm.block_size)

    def admission_reserve(self, request: Request) -> int:
        """Positions admission allocates blocks for up front (reserve admission: all of them;
        prompt admission: those it must process, so its later chunks never preempt)."""
        admission = self.options.admission
        if admission == "reserve":
            return request.num_final_positions
        return request.num_tokens if admission == "prompt" else 0

    def blocks_to_admit(self, request: Request, num_positions: int) -> int:
        """Blocks admission must find free to admit a waiting request with its first
        `num_positions` positions (reserve admission: blocks for every position it will hold)."""
        return self.bm.blocks_for(self.admission_reserve(request) or num_positions)

    # ---- rules: admission ------------------------------------------------------------------

    # Whether admission takes whole prompts only (continuous batching) or a first chunk.
    admits_whole_prompts = False

    def first_chunk_limit(self, request: Request) -> int:
        """Most positions of a waiting request admission runs in its first step."""
        return request.num_tokens

    def admit_waiting(self, budget: StepBudget, now: float) -> None:
        """Admit from the head of the queue while seats and budget last; stop at the first
        request that cannot be admitted (admission keeps the queue's order)."""
        builder = self._builder
        assert builder is not None
        admission = StepBudget(budget.num_tokens, min(budget.num_seqs, self.options.max_num_seqs - len(self.running)))
        while self.waiting and not admission.is_spent:
            request = self.waiting[0]
            if self.admits_whole_prompts and not builder.has_seqs and request.num_tokens > admission.num_tokens:
                # A recompute of prompt + outputs may exceed the budget; it then runs alone.
                admission.num_tokens = request.num_tokens
            taken = self.try_admit(request, admission, now)
            if taken == 0:
                return
            budget.take(taken)

    def try_admit(self, request: Request, budget: StepBudget, now: float) -> int:
        """Admit a waiting request with its first chunk (`first_chunk_limit`, within `budget`).

        Returns the positions scheduled (0 if it cannot be admitted now). A prefix-cache hit
        counts as already processed; at least the last known token is always computed, since
        a KV-only cache holds no logits (seed 21.4). Blocks: those the chunk needs (all it will
        hold under reserve admission), while the watermark stays free.
        """
        if request.num_kv_ready:  # its KV came with it (a transfer): stored, not computed
            hit, host_hits, num_hit = NO_HIT, [], request.num_kv_ready
        else:
            hit = self.prefix.lookup(request)
            host_hits = self.prefix.lookup_host(request, hit)
            num_hit = (hit.num_blocks + len(host_hits)) * self.bm.block_size
        pending = request.num_tokens - num_hit
        chunk = min(pending, self.first_chunk_limit(request), budget.num_tokens)
        if chunk <= 0 or budget.num_seqs <= 0 or (self.admits_whole_prompts and chunk < pending):
            return 0
        # Evictable blocks the hit revives leave the free count.
        revived = sum(1 for b in hit.block_ids if self.bm.ref_counts[b] == 0) if hit.block_ids else 0
        need = self.blocks_to_admit(request, num_hit + chunk) - hit.num_blocks
        reserve = self.num_watermark_blocks() + self.num_output_reserve_blocks(request)
        if not self.bm.can_allocate(need + revived, reserve=reserve):
            return 0
        self._admit(request, now, hit, num_hit)
        if request.num_kv_ready:
            self._store_ready(request)
        if host_hits:
            self.prefix.reload_from_host(request, hit.num_blocks, host_hits)
        self._run(request, chunk)
        budget.take(chunk)
        return chunk

    def _admit(self, request: Request, now: float, hit: PrefixHit = NO_HIT, num_hit: int = 0) -> None:
        """Move a waiting request to the running batch with blocks for its prefix hit (its
        positions are scheduled by the caller)."""
        self.bm.allocate(request.request_id, self.admission_reserve(request), hit)
        self.waiting.remove(request)
        if self.counts_prefix_queries and not request.num_kv_ready:
            # vLLM's convention: every lookup queries the request's known tokens.
            request.num_prefix_query_tokens += request.num_tokens
            request.num_prefix_hit_tokens += num_hit
        if request.first_scheduled_s is None:
            request.first_scheduled_s = now
            request.num_cached_prefix = num_hit
        request.num_processed = num_hit
        self.num_resident_tokens += num_hit
        request.status = Status.RUNNING
        self.running.append(request)
        self._builder.admitted.append(request.request_id)  # type: ignore[union-attr]

    def _store_ready(self, request: Request) -> None:
        """Blocks for the positions whose KV came with an admitted request: it holds them as if
        it had processed them (a later preemption drops them like any)."""
        self._store(request, request.num_kv_ready)
        request.num_kv_ready = 0

    def cached_prefix_positions(self, request: Request, *, remember: bool = True) -> int:
        """Positions of the request's prompt the device cache holds (longest prefix match).
        A reader outside the policy (a router) asks with `remember=False`: the request may
        never come here."""
        return self.prefix.lookup(request, remember=remember).num_blocks * self.bm.block_size

    # ---- rules: running requests and preemption --------------------------------------------

    def schedule_decodes(self, decoders: list[Request], budget: StepBudget) -> None:
        """One position for each decoding request, in batch order, each making room first
        (`make_room`): the blocks all of them need are taken at once where they are free and
        the budget fits them all (no one is preempted then: the same blocks, in the same order).
        Those that run go into the plan together, as columns where they are the first in it."""
        num_decodes = len(decoders)
        if not num_decodes:
            return
        ids = [request.request_id for request in decoders]
        firsts = self.bm.first_new_block_steps(ids)
        if num_decodes <= min(budget.num_tokens, budget.num_seqs) and self.bm.max_decode_steps(ids, 1, firsts) == 1:
            self.bm.append_decode_steps(ids, 1, firsts)
            budget.num_tokens -= num_decodes
            budget.num_seqs -= num_decodes
        else:
            builder = self._builder
            assert builder is not None
            decoding = []
            for request in decoders:
                # Status, not `in self.running`: a scan per request made memory-tight steps quadratic.
                if request.status is Status.RUNNING and not budget.is_spent and self.make_room(request, 1):
                    self._store(request, 1)
                    builder.scheduled.add(request.request_id)  # (no longer a victim)
                    decoding.append(request)
                    budget.take(1)
            decoders, ids = decoding, [request.request_id for request in decoding]
        self._add_decodes(decoders, ids)

    def _add_decodes(self, decoders: list[Request], ids: list[int]) -> None:
        """Put one decode of each of `decoders` (blocks appended) into the plan: as columns where
        nothing is in it yet and no one reads their block tables."""
        builder = self._builder
        assert builder is not None
        if builder.has_seqs or self.emit_block_tables or any(request.is_prefilling for request in decoders):
            self._add_seqs(decoders, 1)
        else:
            builder.decodes = Decodes(ids, [request.num_processed for request in decoders],
                                      [request.prompt_len for request in decoders])
            builder.scheduled.update(ids)

    def schedule_running(self, request: Request, num_new: int) -> bool:
        """Make room for `num_new` more positions of a running request (`make_room`) and put them
        in the plan. Returns False if the request itself was preempted."""
        if not self.make_room(request, num_new):
            return False
        self._run(request, num_new)
        return True

    def make_room(self, request: Request, num_new: int) -> bool:
        """Free blocks for `num_new` more positions of a running request by preempting others.
        Victims are chosen by the queue order among running requests not yet in this step (FCFS:
        the most recently admitted, as vLLM). Returns False if the request itself was preempted."""
        builder = self._builder
        assert builder is not None
        while not self.bm.can_append(request.request_id, num_new):
            victim = self.waiting.order.pick_victim(self.running, builder.scheduled)
            if victim is None or victim is request:
                self.preempt(request)
                return False
            self.preempt(victim)
        return True

    def preempt(self, victim: Request) -> None:
        """Take a running request off the device: swap its KV to the host, or drop it for recompute."""
        builder = self._builder
        assert builder is not None
        builder.preempted.append(victim.request_id)
        self.running.remove(victim)
        if self.options.admission == "conservative":
            self._estimate_ratio()
        victim.num_preemptions += 1
        self.num_resident_tokens -= victim.num_processed
        if self.options.preemption == "swap" and self.host is not None and victim.num_processed > 0:
            reason = self.readmission_reason(victim)
            if reason is not None:
                # Its swap-in would need the blocks that admission would: never (vLLM ignores it then).
                self.bm.free(victim.request_id)
                self._reject_preempted(victim, "swap", reason)
                return
            table = self._device_blocks(victim.request_id)
            if self.prefix.host_prefix is not None:
                self.prefix.host_prefix.make_room(len(table), pinned=builder.pinned_host)
            if self.host.can_hold(len(table)):
                self._swap_out(victim, table)
                return
        self._drop_for_recompute(victim)

    def _estimate_ratio(self) -> None:
        """A preemption shows conservative admission kept too little room: its share becomes
        the running requests' outputs so far, plus RETRACT_DECODE_STEPS more each, over all
        they may produce (SGLang's retract_decode re-estimate), at most 1."""
        produced = sum(r.num_outputs for r in self.running) + RETRACT_DECODE_STEPS * len(self.running)
        total = sum(max(r.num_final_positions - r.prompt_len, 1) for r in self.running)
        self._ratio_set = (min(produced / total, 1.0) if total else self.options.new_token_ratio, self.num_steps)

    def _drop_for_recompute(self, victim: Request) -> None:
        """A victim off the running batch loses its KV: it waits to be computed again (prompt
        and outputs), unless admission could never take it again: then it is rejected with the
        outputs it has (vLLM ignores it), rather than wait forever."""
        self.bm.free(victim.request_id)
        reason = self.readmission_reason(victim)
        if reason is not None:
            self._reject_preempted(victim, "recompute", reason)
            return
        self._mark_preempted(victim, "recompute")
        victim.num_recomputed_tokens += victim.num_processed
        victim.num_processed = 0
        victim.status = Status.WAITING
        self.waiting.add_preempted(victim)
        self.tally.preemptions["recompute"] += 1

    def _reject_preempted(self, victim: Request, kind: str, reason: str) -> None:
        """A victim (off the batch, its blocks freed) that could never come back is rejected
        with the outputs it has, at the preemption (`readmission_reason`)."""
        self.tally.preemptions[kind] += 1
        victim.num_processed = 0
        victim.reject_reason = reason
        self._leave(victim, Status.REJECTED, self._now, self.rejected)

    def _mark_preempted(self, victim: Request, kind: str) -> None:
        """Note when and where a preemption found `victim`, so that the time until it is back
        there is charged to it (`note_resumed`). A request preempted again before it got back
        (a recompute caught part way) keeps the first: its delay runs from that preemption to
        that position, not from the later one to the lower point it had regained."""
        self.preempted_at.setdefault(victim.request_id, (self._now, victim.num_processed, kind))

    def note_resumed(self, request: Request, now: float) -> None:
        """Charge the time from preemption until the request is back where it was."""
        since, target, kind = self.preempted_at[request.request_id]
        if request.num_processed < target:
            return
        del self.preempted_at[request.request_id]
        if kind == "swap":
            request.swap_delay_s += now - since
        else:
            request.recompute_delay_s += now - since

    # ---- rules: the host tier --------------------------------------------------------------

    def _swap_out(self, victim: Request, table: tuple[int, ...]) -> None:
        """Copy a victim's blocks to the host tier and release them on the device."""
        assert self._builder is not None and self.host is not None
        positions = self.bm.stored_positions(victim.request_id)
        host_blocks = self.host.store(victim.request_id, len(table), min(positions, victim.num_processed))
        self._builder.swap_out.extend(zip(table, host_blocks))
        self.tally.blocks_swapped_out += len(table)
        self.bm.free(victim.request_id)
        victim.status = Status.SWAPPED
        victim.num_swaps += 1
        self.swapped.append(victim)
        self.tally.preemptions["swap"] += 1
        self._mark_preempted(victim, "swap")

    def _device_blocks(self, request_id: int) -> tuple[int, ...]:
        """The device blocks a request holds, for a swap's copies: their ids where the block
        manager tracks them, else as many NO_BLOCK_ID (cost models count copies; one that reads
        their ids is a real engine's, which has ids tracked)."""
        if self.bm.tracks_block_ids:
            return self.bm.table(request_id)
        return (NO_BLOCK_ID,) * self.bm.num_table_blocks[request_id]

    def can_swap_in(self, request: Request, num_tokens: int) -> bool:
        """Whether a swapped request can come back in a step with `num_tokens` of its budget
        left: blocks for its stored positions and the ones it runs now, the watermark kept free."""
        assert self.host is not None
        positions = self.host.tables[request.request_id][1]
        num_new = min(request.num_pending, num_tokens)
        return num_new > 0 and self.bm.can_allocate(self.bm.blocks_for(positions + num_new),
                                                    reserve=self.num_watermark_blocks())

    def resume_swapped(self, budget: StepBudget) -> None:
        """Swapped requests come back first-come first-served, before any new admission."""
        while self.swapped and not budget.is_spent and len(self.running) < self.options.max_num_seqs:
            if not self._try_swap_in(self.swapped[0], budget):
                return

    def _try_swap_in(self, request: Request, budget: StepBudget) -> bool:
        """Bring a swapped request back: fresh device blocks, host -> device copies, then run it."""
        assert self.host is not None and self._builder is not None
        if budget.num_seqs <= 0 or not self.can_swap_in(request, budget.num_tokens):
            return False
        blocks, positions = self.host.tables[request.request_id]
        num_new = min(request.num_pending, budget.num_tokens)
        self.host.release(request.request_id)
        self.bm.allocate(request.request_id, positions)
        self.bm.append(request.request_id, positions)
        self._builder.swap_in.extend(zip(blocks, self._device_blocks(request.request_id)))
        self.tally.blocks_swapped_in += len(blocks)
        self.swapped.remove(request)
        request.status = Status.RUNNING
        self.running.append(request)
        self.num_resident_tokens += request.num_processed
        self._run(request, num_new)
        budget.take(num_new)
        return True

    # ---- completing ------------------------------------------------------------------------

    def select_outputs(self, requests: list[Request], now: float) -> list[float]:
        """A pass that ended at `now` covered each request's last known token: one more output
        each, delivered `delivery_s` later. Returns the gaps since their last outputs (for the
        inter-token latencies), in order."""
        self._make_outputs(requests, now)
        return self._deliver(requests, now, repeat(1))

    @staticmethod
    def _make_outputs(requests: Sequence[Request], now: float) -> None:
        """A pass that ended at `now` covered each request's last known token: one more output each."""
        for request in requests:
            request.num_outputs += 1
            if request.prefill_done_s is None:
                request.prefill_done_s = now

    def _deliver(self, requests: Sequence[Request], now: float, counts: Iterable[int]) -> list[float]:
        """Each request's newest `count` outputs (made by `now`) reach its client together,
        `delivery_s` later. Returns the gaps, in order: for each request, the first output's
        since its last delivery (none for its first output), then 0 for each other (a burst)."""
        delivered = now + self.options.delivery_s
        gaps = []
        for request, count in zip(requests, counts):
            if request.last_token_s is None:
                request.first_token_s = delivered
            else:
                gaps.append(delivered - request.last_token_s)
            if count > 1:
                gaps += [0.0] * (count - 1)
            request.last_token_s = delivered
        return gaps

    def finish(self, request: Request, at: float) -> None:
        """A request with all its outputs leaves the batch (delivered at `at`)."""
        self._off_the_batch(request)
        self._release_blocks(request)
        self._leave(request, Status.FINISHED, at, self.finished)

    def _off_the_batch(self, request: Request) -> None:
        """A running request stops running (its blocks are the caller's to see to)."""
        self.running.remove(request)
        self.num_resident_tokens -= request.num_processed

    def _leave(self, request: Request, status: Status, at: float, into: list[Request]) -> None:
        """`request` (off the batch and the queues, its blocks seen to) leaves the policy at
        `at`: finished, rejected or timed out, into that list."""
        self.prefix.forget(request.request_id)
        self.preempted_at.pop(request.request_id, None)
        del self.by_id[request.request_id]
        request.status = status
        request.finish_s = at
        into.append(request)

    def _release_blocks(self, request: Request) -> None:
        """A finished request's blocks go back (a policy may hold them longer), unless the
        policy holds finished requests' blocks for a transfer (`holds_finished_blocks`: a
        disaggregated cluster's prefill replica, until `release_held`)."""
        if not self.holds_finished_blocks:
            self.bm.free(request.request_id)

    def release_held(self, request_id: int) -> None:
        """The blocks a finished request held (`holds_finished_blocks`) go back."""
        self.bm.free(request_id)

    def cancel(self, request: Request, now: float) -> None:
        """Its client gave up on `request` (a timeout) at `now`: it leaves the queue, the batch or
        the host tier, and its blocks go back as a finished request's do (full ones stay in the
        prefix cache, as vLLM's abort leaves them)."""
        if request.status is Status.WAITING:
            self.waiting.remove(request)
            self.bm.free(request.request_id)  # (a no-op where it holds none)
        elif request.status is Status.RUNNING:
            self._off_the_batch(request)
            self._release_blocks(request)
        else:
            assert request.status is Status.SWAPPED and self.host is not None
            self.swapped.remove(request)
            self.host.release(request.request_id)
        self._leave(request, Status.TIMED_OUT, now, self.timed_out)

    def drain_unfinished(self) -> list[Request]:
        """When a time horizon ends the run: everything still queued or running, marked unfinished
        (with requests whose outputs a multi-step group had not delivered)."""
        left = [*self._finishing, *self.running, *self.swapped, *self.waiting]
        for request in left:
            request.status = Status.UNFINISHED
        return left

    # ---- building a step -------------------------------------------------------------------

    def _begin_plan(self) -> PlanBuilder:
        self._builder = self.prefix.builder = PlanBuilder()
        return self._builder

    def _end_plan(self, group_step: int = 0) -> StepPlan | None:
        builder = self._builder
        self._builder = self.prefix.builder = None
        # A step with no sequence still happens if it moves blocks (a swap-out that made room).
        if builder is None or not (builder.has_seqs or builder.swap_out or builder.swap_in):
            return None
        self.num_steps += 1
        return StepPlan(
            step_id=self.num_steps - 1,
            seqs=tuple(builder.seqs),
            decodes=builder.decodes,
            blocks_to_copy=tuple(builder.copies),
            blocks_to_swap_out=tuple(builder.swap_out),
            blocks_to_swap_in=tuple(builder.swap_in),
            block_bytes=self.block_bytes,
            preempted_ids=tuple(builder.preempted),
            admitted_ids=tuple(builder.admitted),
            group_step=group_step,
        )

    def _run(self, request: Request, num_new: int) -> None:
        """Store `num_new` more positions of a running request and put them in the plan."""
        self._store(request, num_new)
        self._add_seqs((request,), num_new)

    def _store(self, request: Request, num_new: int) -> None:
        """Blocks for `num_new` more positions of a running request (copy-on-write copies join the plan)."""
        self._builder.copies.extend(self.bm.append(request.request_id, num_new))  # type: ignore[union-attr]

    def _add_seqs(self, requests: Sequence[Request], num_new: int) -> None:
        """Put `num_new` positions of each of `requests` (blocks already appended) into the plan;
        a sequence selects an output where it reaches the request's last known token."""
        builder = self._builder
        assert builder is not None
        # What only a real engine reads: block tables and prompt content.
        content = self._engine_inputs if self.emit_block_tables else _nothing
        builder.seqs += [
            ScheduledSeq(request.request_id, num_new, request.num_processed,
                         request.num_processed + num_new == request.prompt_len + request.num_outputs,
                         request.prompt_len, *content(request))
            for request in requests
        ]
        builder.scheduled.update([request.request_id for request in requests])

    def _engine_inputs(self, request: Request) -> tuple:
        """A sequence's block table and prompt content, for a real engine."""
        return self.bm.table(request.request_id), request.prompt_token_ids, request.segments

    # ---- checks ----------------------------------------------------------------------------

    def check(self) -> None:
        """Invariants after a step: block accounting in every tier, tables covering processed positions."""
        self.bm.check()
        if self.host is not None:
            host_prefix = self.prefix.host_prefix
            self.host.check(host_prefix.held_blocks() if host_prefix is not None else [])
        positions = self.bm.num_positions
        for request in self.running:
            if request.num_pending < 1:
                raise AssertionError(f"running request {request.request_id} has no position to process")
            stored = positions.get(request.request_id)
            if stored != request.num_processed:
                raise AssertionError(
                    f"request {request.request_id}: block manager stores {stored} positions, "
                    f"request processed {request.num_processed}"
                )
        for request in self.waiting:
            if request.request_id in positions:
                raise AssertionError(f"waiting request {request.request_id} still holds blocks")
        if self.prefix.enabled:
            self._check_salt_isolation()

    def check_drained(self) -> None:
        """After a run that finished everything: no block held in either tier (no leaks)."""
        self.check()
        if self.bm.num_used_blocks:
            raise AssertionError(f"{self.bm.num_used_blocks} KV blocks still referenced after the run")
        if self.host is not None and self.host.tables:
            raise AssertionError(f"{len(self.host.tables)} requests still hold host blocks after the run")

    def _check_salt_isolation(self) -> None:
        owners: dict[int, tuple] = {}
        for request in self.running:
            ident = (request.cache_salt, request.adapter_id)
            for block in self.bm.block_tables.get(request.request_id, ()):
                if owners.setdefault(block, ident) != ident:
                    raise AssertionError(f"block {block} shared across cache salts or adapters")
