"""The event loop: the only module that imports SimPy.

One SimPy process runs the engine: before each step it hands the policy every request that has
arrived, asks it for a plan, advances the clock by the cost model's price for it, and lets the
policy complete it. When nothing can run, it sleeps until the next arrival.
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path

import numpy as np
import simpy

from backends.base import CostModel, step_extras
from policies.protocol import Policy
from policies.stretch import run_aggregates
from simcore.decode_blocks import blocks_each_step
from simcore.errors import ServesimError
from simcore.itl import ItlLog
from simcore.request import Request, Status
from simcore.run_counts import RunCounts
from simcore.steplog import StepLog


@dataclass
class RunLimits:
    # End the run at this simulated time; requests still queued or running are reported unfinished.
    max_sim_time_s: float | None = None
    # End the run after this much wall-clock time (same reporting).
    max_wall_time_s: float | None = None
    # Verify block accounting and request state after every step (slower; on in tests).
    check_invariants: bool = False
    # Take runs of decode-only steps at once when the cost model can price them in bulk, and plan
    # a step's decodes as one column group. Results are identical either way (tested); off gives
    # the straightforward loop: one step, one ScheduledSeq per request, at a time.
    fast_forward: bool = True


@dataclass
class RunResult:
    finished: list[Request]
    rejected: list[Request]
    unfinished: list[Request]
    steps: StepLog
    # Why the run ended: "done", "max_sim_time", or "max_wall_time".
    end_reason: str
    sim_time_s: float
    wall_time_s: float
    num_events: int = 0
    itl: ItlLog = field(default_factory=ItlLog)

    @property
    def requests(self) -> list[Request]:
        """Every request exactly once, in id order."""
        return sorted([*self.finished, *self.rejected, *self.unfinished], key=lambda r: r.request_id)


def simulate(
    requests: Sequence[Request],
    policy: Policy,
    cost_model: CostModel,
    *,
    limits: RunLimits | None = None,
    on_step: Callable[[float], None] | None = None,
    on_finished: Callable[[list[Request]], None] | None = None,
    steps_spill: Path | None = None,
) -> RunResult:
    """Replay `requests` through `policy`, pricing steps with `cost_model`.

    The given requests are a template and are never modified: each is copied when it arrives.
    With `on_finished`, finished requests are handed over in batches and not kept, so a long
    run holds only the requests in flight (the result's `finished` then lists none). With
    `steps_spill`, step records go to that Parquet file as the run goes.

    Requests that arrive while a step runs join the policy's queues when it ends: a step that
    starts at or after a request's arrival time sees it, one that started before does not. (A
    run of steps that arrivals cannot change hands them over before it is applied, with the
    same results and records.)
    """
    with _collector_for_a_run():
        return _simulate(requests, policy, cost_model, limits or RunLimits(), on_step, on_finished, steps_spill)


@contextmanager
def _collector_for_a_run() -> Iterator[None]:
    """The garbage collector's settings while a run sets up, runs and reports. The templates
    live for the whole run: they are frozen first, before the run sorts them, so that no pass
    rescans them (the workload builders make them with the collector off, so the first pass
    after would find them all young: at 1M requests, 0.4 s). And the loop makes no reference
    cycles (tests/test_engine_cycles.py checks), so the collector's young passes, every 700 new
    containers by default, find nothing to free while each rescans the step records and
    requests made since the last: on the 10k reference run they took 4% of the loop. Rarer
    passes still bound what a cycle made elsewhere (a callback) could hold."""
    thresholds = gc.get_threshold()
    gc.freeze()
    if thresholds[0]:  # 0: the caller turned automatic collection off; leave it so
        gc.set_threshold(max(thresholds[0], GC_YOUNG_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _simulate(requests: Sequence[Request], policy: Policy, cost_model: CostModel, limits: RunLimits,
              on_step: Callable[[float], None] | None, on_finished: Callable[[list[Request]], None] | None,
              steps_spill: Path | None) -> RunResult:
    env = simpy.Environment()
    log = StepLog(steps_spill)
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    # Follow-up turns wait for their parent to finish; the rest arrive at fixed times.
    children: dict[int, list[Request]] = {}
    timed = ordered
    if any(r.parent_id is not None for r in ordered):
        known = {r.request_id for r in ordered}
        for request in ordered:
            if request.parent_id is not None and request.parent_id in known:
                children.setdefault(request.parent_id, []).append(request)
        timed = [r for r in ordered if r.parent_id is None or r.parent_id not in known]
    wall_start = time.perf_counter()
    # Released follow-up turns, (arrival time, request id, request), a heap.
    follow_ups: list[tuple[float, int, Request]] = []
    # "now" is the simulated clock: step ends are sums start + duration, the same additions on
    # either path. SimPy's clock follows it to within rounding (a sleep to an exact float cannot
    # always be expressed as now + delay), so times are read from here, never from env.now.
    state = {"end": "done", "events": 0, "next_timed": 0, "now": 0.0, "rejected_seen": 0}
    # Runs of steps need a cost model that prices them without a plan per step: one at a time
    # (`iter_step_times`, preferred; or `iter_run_times`, the same for a whole run's pieces) or in
    # bulk (`aggregate_step_times`); and no per-step callback.
    priced_one_by_one = getattr(cost_model, "iter_step_times", None)
    priced_run = getattr(cost_model, "iter_run_times", None)
    bulk = getattr(cost_model, "aggregate_step_times", None)
    fast = limits.fast_forward and on_step is None and (priced_one_by_one is not None or bulk is not None)
    horizon = limits.max_sim_time_s if limits.max_sim_time_s is not None else math.inf
    num_timed = len(timed)
    if hasattr(policy, "group_decodes"):  # a representation choice only: see RunLimits.fast_forward
        policy.group_decodes = limits.fast_forward
    if hasattr(policy, "run_past_finishes"):
        # A finish releases follow-up turns, whose arrivals must bound the run: only without them.
        policy.run_past_finishes = fast and not children

    def next_arrival() -> tuple[float, bool]:
        """When the next request arrives, and whether it is a follow-up turn (at a tie, the
        fixed-time one comes first)."""
        index = state["next_timed"]
        upcoming = timed[index].arrival_s if index < num_timed else math.inf
        if follow_ups and follow_ups[0][0] < upcoming:
            return follow_ups[0][0], True
        return upcoming, False

    # Read once: an Enum member read from its class costs about 0.15 us on Python 3.11.
    rejected_status = Status.REJECTED

    def take_arrivals(now: float, joined: list[float] | None = None) -> None:
        """Hand the policy every request that has arrived by `now`, in arrival order; the arrival
        times of those that joined its queue (not rejected) go to `joined`, when given."""
        while True:
            if follow_ups:
                at, is_follow_up = next_arrival()
                if at > now:
                    return
            else:  # fixed-time arrivals only (the usual case): next_arrival's test, inline
                index = state["next_timed"]
                if index >= num_timed or timed[index].arrival_s > now:
                    return
                is_follow_up = False
            if is_follow_up:
                request = heapq.heappop(follow_ups)[2]
            else:
                index = state["next_timed"]
                state["next_timed"] = index + 1
                request = timed[index].copy()
            policy.add(request, request.arrival_s)
            state["events"] += 1
            if request.status is rejected_status:
                release_children(request, request.arrival_s)
            elif joined is not None:
                joined.append(request.arrival_s)

    def release_children(parent: Request, at: float) -> None:
        for template in children.pop(parent.request_id, ()):
            child = template.copy()
            child.arrival_s = at + template.think_time_s
            heapq.heappush(follow_ups, (child.arrival_s, child.request_id, child))

    def release_turns(done: list[Request], at: float) -> None:
        """Follow-up turns of requests that finished at `at` start their think time, and those
        of requests rejected since the last call (a victim that could never come back)."""
        if children:
            for request in done:
                release_children(request, at)
            rejected = policy.rejected
            while state["rejected_seen"] < len(rejected):
                request = rejected[state["rejected_seen"]]
                state["rejected_seen"] += 1
                release_children(request, request.finish_s)

    def state_after() -> tuple[int, ...]:
        """The step record's columns read after a step: running, waiting and swapped requests,
        device blocks used and shared, host blocks used, resident tokens."""
        return (len(policy.running), len(policy.waiting), len(policy.swapped), policy.bm.num_used_blocks,
                policy.bm.num_shared_blocks, policy.host.num_used_blocks if policy.host is not None else 0,
                policy.num_resident_tokens)

    def flush(final: bool = False) -> None:
        if on_finished is not None and (final or len(policy.finished) >= FLUSH_EVERY):
            batch = list(policy.finished)
            policy.finished.clear()
            on_finished(batch)

    def price_stretch():  # noqa: ANN202
        """The run of steps of known shapes that comes next, priced so that it can be taken at
        once: (its parts, its start, each step's end and duration, whether arrivals wait), or
        None when there is none (or an arrival comes first)."""
        plan = policy.plan_stretch()
        if plan is None:
            return None
        goes_on = plan.may_go_on()
        parts = [] if goes_on else [plan]  # the parts that pricing reaches (see Stretch.next_part)

        def pieces():  # noqa: ANN202
            for part in plan.parts():
                if part.arrivals_wait != arrivals_wait:
                    # The run's first part decided before pricing whether arrivals bound it.
                    raise AssertionError("the parts of a run disagree on whether arrivals wait")
                parts.append(part)
                yield from part.runs()

        start = state["now"]
        runs = pieces() if goes_on else plan.runs()
        if priced_run is not None:
            durations = priced_run(runs)
        elif priced_one_by_one is not None:
            durations = chain.from_iterable(islice(priced_one_by_one(shape), steps) for steps, shape in runs)
        else:
            durations = chain.from_iterable(np.broadcast_to(bulk(*run_aggregates(shape, steps)), (steps,)).tolist()
                                            for steps, shape in runs)
        # Step ends by repeated addition, exactly as the clock advances one step at a time.
        ends: list[float] = []
        taken: list[float] = []
        add_end, add_taken, inf = ends.append, taken.append, math.inf
        clock = start
        # Where arrivals cannot change the run, it goes on past them (they are taken below).
        arrivals_wait = plan.arrivals_wait
        arrival = math.inf if arrivals_wait else next_arrival()[0]
        if clock >= arrival:
            return None  # an arrival comes first
        for duration in durations:
            if not 0 < duration < inf:
                raise ServesimError(f"cost model returned step time {duration!r}; "
                                    "expected a positive finite number of seconds")
            clock = clock + duration
            if clock >= horizon:
                break
            add_end(clock)
            add_taken(duration)
            if clock >= arrival:
                # The next step would start after an arrival: the policy must see it first.
                # Tested before the next step is priced, which may plan the part it is in.
                break
        if not ends:
            return None  # the horizon comes first
        return parts, start, ends, taken, arrivals_wait

    def take_stretch(parts, start: float, ends: list[float], taken: list[float], arrivals_wait: bool) -> None:  # noqa: ANN001
        """Complete a priced run of steps (see `price_stretch`) once its last step has ended."""
        num_steps = len(ends)
        state["now"] = ends[-1]
        starts = [start, *ends[:-1]]
        # Requests that arrived during the run join the queue as stepping would have them join,
        # each before the first step that starts at or after its arrival; they are all in it
        # before the run is applied, so each step's record counts out those that came later.
        late = None
        if arrivals_wait and num_steps > 1:
            joined: list[float] = []
            take_arrivals(starts[-1], joined)
            if joined:
                late = [len(joined) - bisect_right(joined, at) for at in starts]
        if len(parts) == 1:  # nothing to cut out
            apply_part(parts[0], starts, ends, taken, late)
        elif len(parts) == 2 and parts[1].joins and num_steps > parts[0].num_steps:
            apply_joined(parts[0], parts[1], starts, ends, taken, late)
        else:
            offset = 0
            for part in parts:
                count = min(part.num_steps, num_steps - offset)
                if count <= 0:
                    break
                apply_part(part, starts[offset:offset + count], ends[offset:offset + count],
                           taken[offset:offset + count], late[offset:offset + count] if late is not None else None)
                offset += count
        flush()
        state["events"] += 1
        if limits.check_invariants:
            policy.check()

    def apply_part(part, starts: list[float], ends: list[float], taken: list[float],  # noqa: ANN001
                   late: list[int] | None) -> None:
        """Complete one part of a stretch and record its steps. `late`: for each step, the
        requests in the queue that arrived after it started (None: none)."""
        num_steps = len(ends)
        policy.begin_stretch(part, starts[0])
        if part.readmits:
            return apply_readmits(part, starts, ends, taken, late)
        if num_steps == 1:  # one step (a run cut short, or a prefill step before decodes): one row, as a single step's
            first_step = policy.num_steps
            completes = part.reaches_tail(1)  # the step completes the prompt
            num_decodes = len(part.decoders)
            num_seqs = num_decodes + (part.prefill is not None)
            prefill_tokens = part.tail if completes else part.chunk
            num_selected = num_decodes + completes
            if part.admits_newcomer(1):
                num_seqs += part.num_newcomers
                prefill_tokens += part.newcomer_positions
                # Read before the step: a newcomer whose whole prompt ran has an output after it.
                num_selected += part.num_newcomers_selecting
            release_turns(policy.apply_stretch(part, ends), ends[-1])
            after = state_after()
            if late is not None:
                after = (after[0], after[1] - late[0], *after[2:])
            log.append((
                first_step, starts[0], taken[0], num_seqs, prefill_tokens, num_decodes, num_selected, *after,
                len(part.victims) if part.victims else 0, 0, 0, 0,
            ))
            return
        num_waiting_before = len(policy.waiting)
        shared_before = policy.bm.num_shared_blocks
        first_step = policy.num_steps
        counts = policy.stretch_run_counts(part, num_steps)
        release_turns(policy.apply_stretch(part, ends), ends[-1])
        num_running, num_waiting, num_swapped, blocks_used, blocks_shared, host_used, resident = state_after()
        counts.last = (num_running, blocks_used, resident)
        # Every step but the last shows the state before the run (and the queue, the arrivals
        # taken before it: see `late`); the last one saw any finishes (arrivals during it join
        # after it, as for any step). Swaps and the host tier do not change within a run.
        waiting = (num_waiting_before, num_waiting) if late is None else \
            late_waiting(num_waiting_before, num_waiting, late)
        record_run(first_step, starts, taken, waiting, num_swapped, (shared_before, blocks_shared), host_used, counts)

    def late_waiting(before: int, after: int, late: list[int]) -> list[int]:
        """A run's queue length after each step where arrivals waited: `before` (`after` after
        its last step), less the requests that arrived after each step started (`late`)."""
        waiting = [before - count for count in late]
        waiting[-1] = after - late[-1]
        return waiting

    def record_run(first_step: int, starts: list[float], taken: list[float], waiting: int | Sequence[int],
                   num_swapped: int, shared: int | tuple[int, int], host_used: int, counts: RunCounts) -> None:
        """A run's steps in the step log (see StepLog.add_run for the entries' forms: pairs are
        (every step but the last, the last)). The counts of sequences, prompt positions, decodes,
        selected tokens, running requests, blocks and resident tokens are derived from `counts`
        (0 stands for them); a run has no preemptions, swaps or copies."""
        num_steps = len(starts)
        log.add_run(num_steps, (
            range(first_step, first_step + num_steps), starts, taken, 0, 0, 0, 0, 0, waiting,
            num_swapped, 0, shared, host_used, 0, 0, 0, 0, 0,
        ), counts)

    def apply_joined(part, then, starts: list[float], ends: list[float], taken: list[float],  # noqa: ANN001
                     late: list[int] | None) -> None:
        """apply_part for a stretch and some steps of the one that joins it (`Stretch.joins`),
        applied at once: their records as two runs, the first one's state after its last step
        worked out by the policy."""
        num_steps, num_first = len(ends), part.num_steps
        policy.begin_stretch(part, starts[0])
        num_waiting_before = len(policy.waiting)
        shared_before = policy.bm.num_shared_blocks
        first_step = policy.num_steps
        counts, then_counts = policy.joined_run_counts(part, then, num_steps - num_first)
        release_turns(policy.apply_joined(part, then, ends), ends[-1])
        num_running, num_waiting, num_swapped, blocks_used, blocks_shared, host_used, resident = state_after()
        then_counts.last = (num_running, blocks_used, resident)
        # Neither part changes the queue but by the first one's admission, before it was read.
        if late is None:
            first_waiting, then_waiting = num_waiting_before, (num_waiting_before, num_waiting)
        else:
            waiting = late_waiting(num_waiting_before, num_waiting, late)
            first_waiting, then_waiting = waiting[:num_first], waiting[num_first:]
        record_run(first_step, starts[:num_first], taken[:num_first], first_waiting, num_swapped, shared_before,
                   host_used, counts)
        record_run(first_step + num_first, starts[num_first:], taken[num_first:], then_waiting, num_swapped,
                   (shared_before, blocks_shared), host_used, then_counts)

    def apply_readmits(part, starts: list[float], ends: list[float], taken: list[float],  # noqa: ANN001
                       late: list[int] | None) -> None:
        """apply_part for a stretch that admits its prompt and preempts it in turn (its first
        step's admission or preemption is begin_stretch's): a record per step, its counts worked
        out from the state before and the decodes' new blocks."""
        num_steps, num_decodes, chunk = len(ends), len(part.decoders), part.chunk
        # The queue without the prompt (begin_stretch admitted it, or put it back at the head).
        first_step, num_waiting = policy.num_steps, len(policy.waiting) - (1 if part.victims else 0)
        blocks, resident = policy.bm.num_used_blocks, policy.num_resident_tokens
        new_blocks = blocks_each_step(part.decode_firsts, num_steps, policy.bm.block_size)
        stored_after = part.readmit_positions(num_steps)
        release_turns(policy.apply_stretch(part, ends), ends[-1])
        _, _, num_swapped, _, blocks_shared, host_used, _ = state_after()
        for step, stored in enumerate(stored_after):
            blocks += new_blocks[step]
            resident += num_decodes
            arrived_later = late[step] if late is not None else 0
            if stored:  # the prompt running, with its chunks so far
                row = (num_decodes + 1, chunk, num_decodes, num_decodes, num_decodes + 1, num_waiting - arrived_later,
                       num_swapped, blocks + policy.bm.blocks_for(stored), blocks_shared, host_used, resident + stored, 0)
            else:  # the prompt preempted, back in the queue
                row = (num_decodes, 0, num_decodes, num_decodes, num_decodes, num_waiting + 1 - arrived_later,
                       num_swapped, blocks, blocks_shared, host_used, resident, 1)
            log.append((first_step + step, starts[step], taken[step], *row, 0, 0, 0))

    def end_at_horizon() -> None:
        state["end"] = "max_sim_time"
        state["now"] = horizon

    def steps():  # noqa: ANN202
        while True:
            take_arrivals(state["now"])
            if fast:
                priced = price_stretch()
                if priced is not None:
                    yield _until(env, priced[2][-1])
                    take_stretch(*priced)
                    if limits.max_wall_time_s is not None and time.perf_counter() - wall_start > limits.max_wall_time_s:
                        state["end"] = "max_wall_time"
                        return
                    continue
            start = state["now"]
            plan = policy.schedule(start)
            if plan is None:
                upcoming = next_arrival()[0]
                if upcoming == math.inf:
                    # Nothing will arrive: not even a follow-up turn, whose parent may never run.
                    if policy.has_work() or children:
                        raise ServesimError(_stuck_message(policy, start))
                    return
                if upcoming >= horizon:
                    return end_at_horizon()
                yield _until(env, upcoming)
                state["now"] = upcoming
                continue
            duration = cost_model.step_time(plan)
            if not 0 < duration < math.inf:
                raise ServesimError(f"cost model returned step time {duration!r} for step {plan.step_id}; "
                                    "expected a positive finite number of seconds")
            end = start + duration
            if end >= horizon:
                return end_at_horizon()  # the run ends before this step does
            yield _until(env, end)
            state["now"] = end
            release_turns(policy.complete(plan, end), end)
            flush()
            state["events"] += 1
            log.append(
                (
                    plan.step_id,
                    start,
                    duration,
                    len(plan.seqs),
                    plan.num_prefill_tokens,
                    plan.num_decode_tokens,
                    plan.num_selecting,
                    *state_after(),
                    len(plan.preempted_ids),
                    len(plan.blocks_to_swap_out),
                    len(plan.blocks_to_swap_in),
                    len(plan.blocks_to_copy),
                ),
                _extras(cost_model, plan),
            )
            if limits.check_invariants:
                policy.check()
            if on_step is not None:
                on_step(end)
            if limits.max_wall_time_s is not None and time.perf_counter() - wall_start > limits.max_wall_time_s:
                state["end"] = "max_wall_time"
                return

    stepper = env.process(steps())
    env.run(until=stepper)
    unfinished: list[Request] = []
    if state["end"] != "done":
        unfinished = policy.drain_unfinished()
        # Requests that had not arrived yet when the run ended are unfinished too.
        waiting_to_arrive = {r.request_id for r in timed[state["next_timed"]:]}
        waiting_to_arrive.update(request_id for _, request_id, _ in follow_ups)
        waiting_to_arrive.update(r.request_id for turns in children.values() for r in turns)
        for template in ordered:
            if template.request_id in waiting_to_arrive:
                late = template.copy()
                late.status = Status.UNFINISHED
                unfinished.append(late)
    flush(final=True)
    log.close()
    if limits.check_invariants and state["end"] == "done":
        policy.check_drained()
    return RunResult(
        finished=list(policy.finished),
        rejected=list(policy.rejected),
        unfinished=unfinished,
        steps=log,
        end_reason=state["end"],
        sim_time_s=state["now"],
        wall_time_s=time.perf_counter() - wall_start,
        num_events=state["events"],
        itl=policy.itl if hasattr(policy, "itl") else ItlLog(),
    )


# Finished requests handed to `on_finished` at a time.
FLUSH_EVERY = 4096
# New containers between the collector's young passes during a run (see `simulate`).
GC_YOUNG_THRESHOLD = 100_000


def _extras(cost_model: CostModel, plan) -> dict[str, float] | None:  # noqa: ANN001
    """Columns a cost model adds to a step's record: its own measurements, and link time."""
    moves = plan.blocks_to_swap_in or plan.blocks_to_swap_out
    if not moves and getattr(cost_model, "last_step_extras", None) is None:
        return None
    extras = step_extras(cost_model)
    transfer_time = getattr(cost_model, "transfer_time", None)
    if transfer_time is not None and moves:
        extras["transfer_s"] = transfer_time(plan)
    return extras


def _until(env: simpy.Environment, when: float) -> simpy.Timeout:
    """The event that lets SimPy's clock reach `when` (to within rounding: the engine keeps the
    exact time)."""
    return env.timeout(max(when - env.now, 0.0))


def _stuck_message(policy, now: float) -> str:  # noqa: ANN001
    head = policy.waiting[0] if policy.waiting else None
    detail = ""
    if head is not None:
        detail = (
            f"; the first waiting request {head.request_id} needs {head.num_tokens} positions "
            f"({policy.bm.blocks_for(head.num_tokens)} blocks) and {policy.bm.num_free_blocks} "
            f"of {policy.bm.num_blocks} blocks are free"
        )
    return (
        f"the run cannot finish: at t={now:.3f}s no step can be scheduled and no request will "
        f"arrive ({len(policy.waiting)} waiting, {len(policy.running)} running, "
        f"{len(policy.swapped)} swapped){detail}"
    )
