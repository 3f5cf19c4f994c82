"""Machinery every policy shares: queues, admission, preemption, swaps, and `complete()`.

A policy is synchronous and contains no SimPy. The engine calls `add()` on arrival,
`schedule(now)` for the next `StepPlan`, and `complete(plan, now)` once the step's time has
passed. Each request simply catches its processed count up to its known tokens (vLLM v1's
view): there is no separate prefill or decode phase, so chunked prefill, prefix hits and
recompute after preemption all fall out of the same counters.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from policies.budget import StepBudget
from policies.fast_path import (
    StretchMixin,
    request_ids,
    steps_left,
    steps_to_first_finish,
    total_context,
)
from policies.host_pool import HostPool
from policies.host_prefix import HostPrefixCache
from policies.prefix_reuse import NO_HIT, PrefixReuseMixin
from policies.readmit_cycle import ReadmitCycleMixin
from policies.stretch import DecoderCarry
from policies.tally import Tally
from simcore.block_manager import BlockManager, PrefixHit
from simcore.itl import ItlLog
from simcore.plan import NO_BLOCK_ID, DecodeGroup, ScheduledSeq, StepPlan, StepSeqs
from simcore.prefix import PrefixHasher
from simcore.request import Request, Status

# Members read once here: reading one from its class costs about 0.15 us on Python 3.11 (a
# module global, 0.01 us), and every request is added, admitted and finished (and each step
# planned one at a time tests every decoder's).
_WAITING, _RUNNING, _FINISHED = Status.WAITING, Status.RUNNING, Status.FINISHED

Admission = Literal["optimistic", "reserve", "watermark"]
Preemption = Literal["recompute", "swap"]


@dataclass(frozen=True, slots=True)
class PlanExtras:
    """What a policy's step plans carry beyond the schedule, for the cost model."""

    block_tables: bool = False  # each sequence's block table (a real engine reads them)
    block_bytes: int = 0  # the bytes a KV block holds (a swap's link time)


@dataclass
class SchedulerOptions:
    # Most requests running at once (vLLM max_num_seqs).
    max_num_seqs: int = 256
    # Most positions processed in one step, prefill and decode together.
    max_num_batched_tokens: int = 8192
    # How admission accounts for future KV growth (seed 21.3): allocate as you go and preempt
    # when out (optimistic), keep a fraction of blocks free for running requests (watermark), or
    # reserve prompt + outputs up front (reserve; uses max_tokens when set, else the workload's
    # output length, which a real server would not know: an upper bound on its caution).
    admission: Admission = "optimistic"
    watermark: float = 0.01
    # What happens to a victim's KV under memory pressure: discard and recompute, or swap to host.
    preemption: Preemption = "recompute"
    # Longest prompt + output a request may have; longer ones are rejected with a reason.
    max_model_len: int | None = None
    # Selection/delivery time added after the step that selects an output (TTFT's third term).
    delivery_s: float = 0.0


class BasePolicy(PrefixReuseMixin, ReadmitCycleMixin, StretchMixin):
    name = "base"

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
        # A policy keeps at most 29 attributes, these and the engine's (a few more, and every
        # read of them is slower: tests/test_policy_attributes.py).
        self.options = options
        self.bm = block_manager
        self.hasher = hasher
        self.host = host
        self.plan_extras = PlanExtras(emit_block_tables, block_bytes)
        # Plan a step's decodes as one DecodeGroup (set by the engine's fast path).
        self.group_decodes = False
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.finished: list[Request] = []
        self.rejected: list[Request] = []
        self.by_id: dict[int, Request] = {}
        self.num_steps = 0
        self.itl = ItlLog()
        self.num_resident_tokens = 0
        self.tally = Tally()
        self._prefix: dict[int, tuple[list[int], list[tuple]]] = {}
        self._preempted_at: dict[int, tuple[float, int, str]] = {}
        # How many running requests, from the oldest, are known to be decoding (`_all_decoding`
        # holds for them) without a pass over the batch: set where a step or a run ends, from
        # what it did; 0 (unknown) while a step is planned.
        self._num_known_decoding = 0
        # As the step now planned began: how many of the running requests, from the oldest,
        # were known to decode, and whether that was all of them.
        self._decoding_before_step: tuple[int, bool] = (0, False)
        # What the last run of steps left of its decoders for the next plan (fast path only).
        self._carry: DecoderCarry | None = None
        self._now = 0.0
        self._plan: _PlanBuilder | None = None
        self.host_prefix: HostPrefixCache | None = None
        # Admissions count the positions they query the prefix cache for (vLLM's convention):
        # where it is on, or where it is asked for but could never hit (see the runner).
        self.counts_prefix_queries = block_manager.enable_prefix_caching
        if options.preemption == "swap" and host is None:
            raise ValueError("preemption 'swap' needs a host tier (kv_cache.host_memory_gib > 0)")

    # ---- the engine's three calls ---------------------------------------------------------

    def add(self, request: Request, now: float) -> None:
        reason = self.rejection_reason(request)
        if reason is not None:
            request.status = Status.REJECTED
            request.reject_reason = reason
            request.finish_s = now
            self.rejected.append(request)
            return
        request.status = _WAITING
        self.by_id[request.request_id] = request
        self.waiting.append(request)

    def schedule(self, now: float) -> StepPlan | None:
        """The next step's plan, or None when nothing can run until something arrives."""
        self._now = now
        self._carry = None  # the step may change any running request
        self._decoding_before_step = (self._num_known_decoding, self._num_known_decoding == len(self.running))
        self._num_known_decoding = 0
        self._plan = _PlanBuilder()
        self._fill(now)
        while not self._plan.num_seqs and not self._plan.swap_out and self._plan.preempted:
            # Preempting freed blocks but nothing ran: plan again with the room now available.
            preempted = self._plan.preempted
            self._plan = _PlanBuilder()
            self._plan.preempted.extend(preempted)
            self._fill(now)
            if self._plan.preempted == preempted and not self._plan.num_seqs:
                break
        return self._end_plan()

    def _fill(self, now: float) -> None:
        """Put this step's work into `self._plan` (each policy's own admission and running loops)."""
        raise NotImplementedError

    def complete(self, plan: StepPlan, now: float) -> list[Request]:
        """Advance every scheduled request by its processed tokens; select outputs; retire."""
        done: list[Request] = []
        gaps: list[float] = []
        seqs = plan.seqs
        if plan.decodes is not None:
            self._complete_decodes(plan.decodes, now, gaps, done)
            seqs = seqs.others
        for seq in seqs:
            request = self.by_id[seq.request_id]
            before = request.num_processed
            request.num_processed = before + seq.num_new_tokens
            self.num_resident_tokens += seq.num_new_tokens
            if self.bm.enable_prefix_caching:
                self._register_full_blocks(request, before)
            if request.request_id in self._preempted_at:
                self._note_resumed(request, now)
            if seq.selects_token:
                self._select_output(request, now, gaps)
                if request.is_finished:
                    done.append(request)
        if gaps:
            self.itl.add_gaps(gaps)
        for request in done:
            self._finish(request, now + self.options.delivery_s)
        # Requests outside the plan are as they were; those in it decode now if each selected.
        if self._decoding_before_step[1] and plan.num_selecting == len(plan.seqs):
            self._num_known_decoding = len(self.running)
        return done

    def _select_output(self, request: Request, now: float, gaps: list[float]) -> None:
        """A pass that ended at `now` covered the request's last known token: one more output."""
        request.num_outputs += 1
        if request.prefill_done_s is None:
            request.prefill_done_s = now
        delivered = now + self.options.delivery_s
        if request.last_token_s is None:
            request.first_token_s = delivered
        else:
            gaps.append(delivered - request.last_token_s)
        request.last_token_s = delivered

    def _complete_decodes(self, group: DecodeGroup, now: float, gaps: list[float], done: list[Request]) -> None:
        """`complete` for a decode group: the same updates, read and written in tight passes."""
        requests = list(map(self.by_id.__getitem__, group.request_ids))
        delivered = now + self.options.delivery_s
        gaps.extend([delivered - request.last_token_s for request in requests])
        preempted = self._preempted_at
        if self.bm.enable_prefix_caching:
            for request in requests:
                before = request.num_processed
                request.num_processed = before + 1
                request.num_outputs += 1
                request.last_token_s = delivered
                self._register_full_blocks(request, before)
        else:
            for request in requests:
                request.num_processed += 1
                request.num_outputs += 1
                request.last_token_s = delivered
        if preempted:
            # Under memory pressure some victim is nearly always waiting: look up the few that
            # decode here rather than test every request (each only updates its own delays).
            for request_id in preempted.keys() & group.request_ids:
                self._note_resumed(self.by_id[request_id], now)
        self.num_resident_tokens += len(requests)
        if steps_to_first_finish(requests) <= 0:
            done.extend(r for r in requests if r.num_outputs >= r.num_target_outputs)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # ---- checks ---------------------------------------------------------------------------

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
        if self.options.admission != "watermark":
            return 0
        return int(self.options.watermark * self.bm.num_blocks)

    # ---- building a step ------------------------------------------------------------------

    def _end_plan(self) -> StepPlan | None:
        builder = self._plan
        self._plan = None
        # A step with no sequence still happens if it moves blocks (a swap-out that made room).
        if builder is None or not (builder.num_seqs or builder.swap_out or builder.swap_in):
            return None
        self.num_steps += 1
        seqs = tuple(builder.seqs)
        return StepPlan(
            step_id=self.num_steps - 1,
            seqs=StepSeqs(builder.decodes, seqs) if builder.decodes is not None else seqs,
            blocks_to_copy=tuple(builder.copies),
            blocks_to_swap_out=tuple(builder.swap_out),
            blocks_to_swap_in=tuple(builder.swap_in),
            block_bytes=self.plan_extras.block_bytes,
            preempted_ids=tuple(builder.preempted),
        )

    def _add_seq(self, request: Request, num_new: int) -> None:
        """Put `num_new` positions of a request (blocks already appended) into the plan."""
        builder = self._plan
        assert builder is not None
        context = request.num_processed
        prompt_len = request.prompt_len
        builder.seqs.append(ScheduledSeq(  # positional: the fields in order (cheaper than keywords)
            request.request_id, num_new, context, context + num_new == prompt_len + request.num_outputs, prompt_len,
            self.bm.table(request.request_id) if self.plan_extras.block_tables else (), request.prompt_token_ids,
            request.segments,
        ))
        builder.scheduled.add(request.request_id)

    def _schedule_running(self, request: Request, num_new: int) -> bool:
        """Make room for `num_new` more positions of a running request, preempting if needed.

        Victims are the lowest-priority running requests not yet in this step (the most
        recently admitted first, as vLLM does). Returns False if the request itself was preempted.
        """
        builder = self._plan
        assert builder is not None
        while not self.bm.can_append(request.request_id, num_new):
            victim = self._pick_victim(exclude=builder.scheduled)
            if victim is None or victim is request:
                self._preempt(request)
                return False
            self._preempt(victim)
        builder.copies.extend(self.bm.append(request.request_id, num_new))
        self._add_seq(request, num_new)
        return True

    def _schedule_decodes(self, decoders: list[Request], budget: StepBudget, *, all_decoding: bool = False) -> None:
        """One position for each decoding request: in bulk when every new block is at hand,
        else one by one with preemption. Both ways allocate in the same order."""
        builder = self._plan
        assert builder is not None
        ids = request_ids(decoders)
        firsts = self.bm.first_new_block_steps(ids)
        fits = bool(decoders) and len(decoders) <= min(budget.num_tokens, budget.num_seqs)
        room = fits and self.bm.max_decode_steps(ids, 1, firsts) == 1
        if fits and not room and not self.bm.tracks_block_ids and not builder.scheduled:
            num_kept = self._preempt_for_decodes(decoders, firsts)
            decoders, ids, firsts = decoders[:num_kept], ids[:num_kept], firsts[:num_kept]
            # The kept prefix has its blocks now (asked again: the block manager has the last word).
            room = bool(decoders) and self.bm.max_decode_steps(ids, 1, firsts) == 1
        if room:
            self.bm.append_decode_steps(ids, 1, firsts)
            if self.group_decodes and not self.plan_extras.block_tables and not builder.num_seqs \
                    and (all_decoding or self._all_decoding(decoders)):
                contexts = tuple([request.num_processed for request in decoders])
                builder.decodes = DecodeGroup(tuple(ids), contexts, tuple([request.prompt_len for request in decoders]),
                                              sum(contexts))
            else:
                self._add_decode_seqs(decoders)
            builder.scheduled.update(ids)
            budget.num_tokens -= len(decoders)
            budget.num_seqs -= len(decoders)
            return
        for request in decoders:
            # Status, not `in self.running`: a scan per request made memory-tight steps quadratic.
            if request.status is _RUNNING and not budget.is_spent:
                if self._schedule_running(request, 1):
                    budget.take(1)

    def _preempt_for_decodes(self, decoders: list[Request], firsts: list[int]) -> int:
        """Preempt exactly as the one-by-one loop below would when blocks are short; returns how
        many decoders (a prefix) keep their place (see `_decode_victims`)."""
        num_kept, victims = self._decode_victims(decoders, firsts)
        for victim in victims:
            self._preempt(victim)
        return num_kept

    def _decode_victims(self, decoders: list[Request], firsts: list[int]) -> tuple[int, list[Request]]:
        """Who the decodes of `decoders` (next new-block steps `firsts`) preempt when blocks are
        short, worked out without preempting: (how many decoders, a prefix, keep their place,
        the victims in the order they go).

        Each decoder in turn that needs a block while none is free takes the newest running
        requests' blocks; a decoder that would be the next victim is preempted itself, and so
        are all after it. Worked out on counts, so only where block ids carry no meaning.
        """
        running = self.running
        held = self.bm.num_table_blocks
        free = self.bm.num_free_blocks
        back = len(running)
        victims: list[Request] = []
        victim_ids: set[int] = set()
        for index, (request, first) in enumerate(zip(decoders, firsts)):
            if request.request_id in victim_ids:
                return index, victims  # preempted already, as is every decoder after it
            if first > 1:
                continue  # its block has room for this step's position
            while free == 0:
                back -= 1
                victim = running[back]
                if victim is request:
                    victims.append(request)
                    return index, victims
                victims.append(victim)
                victim_ids.add(victim.request_id)
                free += held[victim.request_id]
            free -= 1
        return len(decoders), victims

    def _add_decode_seqs(self, decoders: list[Request]) -> None:
        builder = self._plan
        assert builder is not None
        tables = self.plan_extras.block_tables
        for request in decoders:
            builder.seqs.append(ScheduledSeq(
                request.request_id, 1, request.num_processed, True, request.prompt_len,
                self.bm.table(request.request_id) if tables else (), request.prompt_token_ids,
                request.segments,
            ))

    def _pick_victim(self, exclude: set[int]) -> Request | None:
        for candidate in reversed(self.running):
            if candidate.request_id not in exclude:
                return candidate
        return None

    def _try_admit(
        self, request: Request, budget: StepBudget, max_chunk: int, now: float, *, whole: bool = False
    ) -> int:
        """Admit a waiting request with a first chunk of up to `max_chunk` positions.

        Returns the positions scheduled (0 if it cannot be admitted now). A prefix-cache hit
        counts as already processed; at least the last known token is always computed, since
        a KV-only cache holds no logits (seed 21.4).
        """
        hit = self._lookup_prefix(request)
        host_hits = self._lookup_host_prefix(request, hit)
        num_hit = (hit.num_blocks + len(host_hits)) * self.bm.block_size
        pending = request.num_tokens - num_hit
        chunk = min(pending, max_chunk, budget.num_tokens)
        if chunk <= 0 or budget.num_seqs <= 0 or (whole and chunk < pending):
            return 0
        revived = sum(1 for b in hit.block_ids if self.bm.ref_counts[b] == 0) if hit.block_ids else 0
        need = self._blocks_to_admit(request, num_hit + chunk) - hit.num_blocks
        if not self.bm.can_allocate(need + revived, reserve=self.num_watermark_blocks()):
            return 0
        self._admit(request, now, self._admission_reserve(request), hit, num_hit)
        if host_hits:
            self._reload_from_host(request, hit.num_blocks, host_hits)
        assert self._plan is not None
        self._plan.copies.extend(self.bm.append(request.request_id, chunk))
        self._add_seq(request, chunk)
        budget.take(chunk)
        return chunk

    def _admit(self, request: Request, now: float, reserve_positions: int = 0, hit: PrefixHit = NO_HIT,
               num_hit: int = 0) -> None:
        """Move a waiting request to the running batch with blocks for its prefix hit (its
        positions are scheduled by the caller)."""
        self.bm.allocate(request.request_id, reserve_positions, hit)
        self.waiting.remove(request)
        if self.counts_prefix_queries:
            # vLLM's convention: every lookup queries the request's known tokens.
            request.num_prefix_query_tokens += request.num_tokens
            request.num_prefix_hit_tokens += num_hit
        if request.first_scheduled_s is None:
            request.first_scheduled_s = now
            request.num_cached_prefix = num_hit
        request.num_processed = num_hit
        self.num_resident_tokens += num_hit
        request.status = _RUNNING
        self.running.append(request)

    # ---- preemption and swaps -------------------------------------------------------------

    def _preempt(self, victim: Request) -> None:
        """Take a running request off the device: swap its KV to the host, or drop it for recompute."""
        builder = self._plan
        assert builder is not None
        builder.preempted.append(victim.request_id)
        self._take_off_running(victim)
        if self.options.preemption == "swap" and self.host is not None and victim.num_processed > 0:
            reason = self.readmission_reason(victim)
            if reason is not None:
                # Its swap-in would need the blocks that admission would: never (vLLM ignores it then).
                self.bm.free(victim.request_id)
                self._reject_preempted(victim, "swap", reason)
                return
            table = self._device_blocks(victim.request_id)
            if self.host_prefix is not None:
                self.host_prefix.make_room(len(table), pinned=builder.pinned_host)
            if self.host.can_hold(len(table)):
                self._swap_out(victim, table)
                return
        self._drop_for_recompute(victim)

    def _take_off_running(self, victim: Request) -> None:
        """A preempted request leaves the running batch (where its KV goes is the caller's)."""
        self.running.remove(victim)
        victim.num_preemptions += 1
        self.num_resident_tokens -= victim.num_processed

    def _drop_for_recompute(self, victim: Request) -> None:
        """A victim off the running batch loses its KV: it waits at the head of the queue to be
        computed again (prompt and outputs), unless admission could never take it again: then
        it is rejected with the outputs it has (vLLM ignores it), rather than wait forever."""
        self.bm.free(victim.request_id)
        reason = self.readmission_reason(victim)
        if reason is not None:
            self._reject_preempted(victim, "recompute", reason)
            return
        self._mark_preempted(victim, "recompute")
        victim.num_recomputed_tokens += victim.num_processed
        victim.num_processed = 0
        victim.status = Status.WAITING
        self.waiting.appendleft(victim)
        self.tally.preemptions["recompute"] += 1

    def _reject_preempted(self, victim: Request, kind: str, reason: str) -> None:
        """A victim (off the batch, its blocks freed) that could never come back is rejected
        with the outputs it has, at the preemption (`readmission_reason`)."""
        self.tally.preemptions[kind] += 1
        self._prefix.pop(victim.request_id, None)
        self._preempted_at.pop(victim.request_id, None)
        del self.by_id[victim.request_id]
        victim.num_processed = 0
        victim.status = Status.REJECTED
        victim.reject_reason = reason
        victim.finish_s = self._now
        self.rejected.append(victim)

    def _swap_out(self, victim: Request, table: tuple[int, ...]) -> None:
        """Copy a victim's blocks to the host tier and release them on the device."""
        assert self._plan is not None and self.host is not None
        positions = self.bm.stored_positions(victim.request_id)
        host_blocks = self.host.store(victim.request_id, len(table), min(positions, victim.num_processed))
        self._plan.swap_out.extend(zip(table, host_blocks))
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

    def _can_swap_in(self, request: Request, num_tokens: int) -> bool:
        """Whether a swapped request can come back in a step with `num_tokens` of its budget
        left: blocks for its stored positions and the ones it runs now, the watermark kept free
        (`_try_swap_in`'s test; the fast path's `_may_swap_in_during_stretch` asks it too)."""
        assert self.host is not None
        positions = self.host.tables[request.request_id][1]
        num_new = min(request.num_pending, num_tokens)
        return num_new > 0 and self.bm.can_allocate(self.bm.blocks_for(positions + num_new),
                                                    reserve=self.num_watermark_blocks())

    def _try_swap_in(self, request: Request, budget: StepBudget) -> bool:
        """Bring a swapped request back: fresh device blocks, host -> device copies, then run it."""
        assert self.host is not None and self._plan is not None
        if budget.num_seqs <= 0 or not self._can_swap_in(request, budget.num_tokens):
            return False
        blocks, positions = self.host.tables[request.request_id]
        num_new = min(request.num_pending, budget.num_tokens)
        self.host.release(request.request_id)
        self.bm.allocate(request.request_id, positions)
        self.bm.append(request.request_id, positions)
        device_blocks = self._device_blocks(request.request_id)
        self._plan.swap_in.extend(zip(blocks, device_blocks))
        self.tally.blocks_swapped_in += len(blocks)
        self.swapped.remove(request)
        request.status = Status.RUNNING
        self.running.append(request)
        self.num_resident_tokens += request.num_processed
        self._plan.copies.extend(self.bm.append(request.request_id, num_new))
        self._add_seq(request, num_new)
        budget.take(num_new)
        return True

    def _admission_budget(self, budget: StepBudget) -> StepBudget:
        """The step's token budget with sequences limited by free running slots."""
        return StepBudget(budget.num_tokens, min(budget.num_seqs, self.options.max_num_seqs - len(self.running)))

    def _resume_swapped(self, budget: StepBudget) -> None:
        """Swapped requests come back first-come first-served, before any new admission."""
        while self.swapped and not budget.is_spent and len(self.running) < self.options.max_num_seqs:
            if not self._try_swap_in(self.swapped[0], budget):
                return

    def _mark_preempted(self, victim: Request, kind: str) -> None:
        """Note when and where a preemption found `victim`, so that the time until it is back
        there is charged to it (`_note_resumed`). A request preempted again before it got back
        (a recompute caught part way) keeps the first: its delay runs from that preemption to
        that position, not from the later one to the lower point it had regained."""
        self._preempted_at.setdefault(victim.request_id, (self._now, victim.num_processed, kind))

    def _note_resumed(self, request: Request, now: float) -> None:
        """Charge the time from preemption until the request is back where it was."""
        since, target, kind = self._preempted_at[request.request_id]
        if request.num_processed < target:
            return
        del self._preempted_at[request.request_id]
        if kind == "swap":
            request.swap_delay_s += now - since
        else:
            request.recompute_delay_s += now - since

    def _finish(self, request: Request, at: float) -> None:
        self.running.remove(request)
        self.num_resident_tokens -= request.num_processed
        self._release_blocks(request)
        self._prefix.pop(request.request_id, None)
        self._preempted_at.pop(request.request_id, None)
        del self.by_id[request.request_id]
        request.status = _FINISHED
        request.finish_s = at
        self.finished.append(request)

    def _release_blocks(self, request: Request) -> None:
        """A finished request's blocks go back (a policy may hold them longer)."""
        self.bm.free(request.request_id)

    def drain_unfinished(self) -> list[Request]:
        """When a time horizon ends the run: everything still queued or running, marked unfinished."""
        left = [*self.running, *self.swapped, *self.waiting]
        for request in left:
            request.status = Status.UNFINISHED
        return left

    def check(self) -> None:
        """Invariants after a step: block accounting in every tier, tables covering processed positions."""
        self.bm.check()
        if self.host is not None:
            self.host.check(self.host_prefix.held_blocks() if self.host_prefix is not None else [])
        known = self._num_known_decoding
        if known > len(self.running) or (known and not self._all_decoding(self.running[:known])):
            raise AssertionError(f"the first {known} of {len(self.running)} running requests are taken "
                                 "to be decoding, and are not")
        self._check_carry()
        positions = self.bm.num_positions
        for request in self.running:
            if request.num_pending < 1:
                # The fast path relies on it: a pass covering every known token selects an output.
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
        if self.hasher is not None and self.bm.enable_prefix_caching:
            self._check_salt_isolation()

    def _check_carry(self) -> None:
        """What the last run left for the next plan is what reading the batch would give."""
        carry = self._carry
        if carry is None:
            return
        requests = carry.requests
        if self.running[:len(requests)] != requests or not self._all_decoding(requests):
            raise AssertionError("the last run's decoders are not the decoding prefix of the running batch")
        remaining = steps_left(requests)
        figures = (carry.ids, carry.context, carry.steps_to_finish)
        if figures != (request_ids(requests), total_context(requests), min(remaining)):
            raise AssertionError(f"the last run's decoders carry {figures[1:]}, not what the batch gives")
        carried = carry.steps_left()
        if carried is not None and carried != remaining:
            raise AssertionError("the last run's decoders carry wrong steps to their last outputs")

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


class _PlanBuilder:
    __slots__ = ("seqs", "decodes", "copies", "swap_out", "swap_in", "preempted", "scheduled", "pinned_host")

    def __init__(self) -> None:
        self.seqs: list[ScheduledSeq] = []
        # Decodes kept as columns, ahead of `seqs` in batch order (fast path only).
        self.decodes: DecodeGroup | None = None
        self.copies: list[tuple[int, int]] = []
        self.swap_out: list[tuple[int, int]] = []
        self.swap_in: list[tuple[int, int]] = []
        self.preempted: list[int] = []
        self.scheduled: set[int] = set()
        # Host blocks read by this plan's swap-ins: not to be overwritten by its swap-outs.
        self.pinned_host: set[int] = set()

    @property
    def num_seqs(self) -> int:
        return len(self.seqs) + (len(self.decodes) if self.decodes is not None else 0)
