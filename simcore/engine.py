"""The event loop: the only module that imports SimPy.

Two processes share one SimPy environment: arrivals hand requests to the policy at their
arrival times, and the step loop asks the policy for a plan, advances the clock by the cost
model's price for it, and lets the policy complete it. When nothing can run, the step loop
sleeps until the next arrival.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import simpy

from backends.base import CostModel, step_extras
from policies.protocol import Policy
from simcore.errors import ServesimError
from simcore.itl import ItlLog
from simcore.request import Request, Status
from simcore.steplog import StepLog


@dataclass
class RunLimits:
    # End the run at this simulated time; requests still queued or running are reported unfinished.
    max_sim_time_s: float | None = None
    # End the run after this much wall-clock time (same reporting).
    max_wall_time_s: float | None = None
    # Verify block accounting and request state after every step (slower; on in tests).
    check_invariants: bool = False
    # Take runs of decode-only steps at once when the cost model can price them in bulk.
    # Results are identical either way (tested); off gives the straightforward step-by-step loop.
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
    """
    limits = limits or RunLimits()
    env = simpy.Environment()
    log = StepLog(steps_spill)
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    known = {r.request_id for r in ordered}
    # Follow-up turns wait for their parent to finish; the rest arrive at fixed times.
    children: dict[int, list[Request]] = {}
    for request in ordered:
        if request.parent_id is not None and request.parent_id in known:
            children.setdefault(request.parent_id, []).append(request)
    timed = [r for r in ordered if r.parent_id is None or r.parent_id not in known]
    wall_start = time.perf_counter()
    arrived: set[int] = set()
    state = {"arrivals_done": not timed, "pending": sum(len(c) for c in children.values()),
             "wake": env.event(), "end": "done", "events": 0, "next_timed": 0}
    follow_up_times: list[float] = []  # arrival times of released follow-up turns (a heap)
    bulk = getattr(cost_model, "aggregate_step_times", None) if limits.fast_forward else None
    if on_step is not None:
        bulk = None  # a per-step callback wants every step
    horizon = limits.max_sim_time_s if limits.max_sim_time_s is not None else math.inf

    def arrive(template: Request) -> None:
        request = dataclasses.replace(template)
        arrived.add(request.request_id)
        policy.add(request, env.now)
        state["events"] += 1
        if request.status is Status.REJECTED:
            release_children(request)
        if not state["wake"].triggered:
            state["wake"].succeed()

    def arrivals():  # noqa: ANN202
        for index, request in enumerate(timed):
            if request.arrival_s > env.now:
                yield env.timeout(request.arrival_s - env.now)
            state["next_timed"] = index + 1
            arrive(request)
        state["arrivals_done"] = True
        if not state["wake"].triggered:
            state["wake"].succeed()

    def follow_up(request: Request):  # noqa: ANN202
        yield env.timeout(request.think_time_s)
        state["pending"] -= 1
        heapq.heappop(follow_up_times)
        arrive(request)

    def release_children(parent: Request) -> None:
        for template in children.pop(parent.request_id, ()):
            child = dataclasses.replace(template, arrival_s=env.now + template.think_time_s)
            heapq.heappush(follow_up_times, child.arrival_s)
            env.process(follow_up(child))

    def flush(final: bool = False) -> None:
        if on_finished is not None and (final or len(policy.finished) >= FLUSH_EVERY):
            batch = list(policy.finished)
            policy.finished.clear()
            on_finished(batch)

    def next_arrival() -> float:
        index = state["next_timed"]
        upcoming = timed[index].arrival_s if index < len(timed) else math.inf
        return min(upcoming, follow_up_times[0]) if follow_up_times else upcoming

    def stretch():  # noqa: ANN202
        """Take a run of steps of one known shape at once; returns the number taken (0 if none)."""
        plan = policy.plan_stretch()
        if plan is None or plan.num_steps < 2:
            return 0
        start = env.now
        durations = np.broadcast_to(bulk(*plan.shapes()), (plan.num_steps,))
        # Step ends by repeated addition, exactly as the clock advances one step at a time.
        ends = []
        clock = start
        arrival = next_arrival()
        for duration in durations.tolist():
            if clock >= arrival:
                break  # this step would start after an arrival: the policy must see it first
            if not 0 < duration < math.inf:
                raise ServesimError(f"cost model returned step time {duration!r}; "
                                    "expected a positive finite number of seconds")
            clock = clock + duration
            if clock >= horizon:
                break
            ends.append(clock)
        if len(ends) < 2:
            return 0
        num_decodes, chunk = len(plan.decoders), plan.chunk
        num_running, num_swapped = len(policy.running), len(policy.swapped)
        num_waiting_before = len(policy.waiting)
        blocks_before, resident = policy.bm.num_used_blocks, policy.num_resident_tokens
        shared_before = policy.bm.num_shared_blocks
        first_step = policy.num_steps
        added = policy.stretch_blocks_added(plan, len(ends))
        yield from _sleep_until(env, ends[-1])
        done = policy.apply_stretch(plan, ends)
        for request in done:
            if children:
                release_children(request)
        flush()
        starts = [start, *ends[:-1]]
        host_used = policy.host.num_used_blocks if policy.host is not None else 0
        tokens = num_decodes + chunk
        rows = [
            (first_step + j, starts[j], ends[j] - starts[j], plan.num_seqs, chunk, num_decodes, num_decodes,
             num_running, num_waiting_before, num_swapped, blocks_before + added[j], shared_before, host_used,
             resident + tokens * (j + 1), 0, 0, 0, 0)
            for j in range(len(ends) - 1)
        ]
        # The last step saw any finishes and any arrival during it.
        rows.append((first_step + len(ends) - 1, starts[-1], ends[-1] - starts[-1], plan.num_seqs, chunk,
                     num_decodes, num_decodes, len(policy.running), len(policy.waiting), num_swapped,
                     policy.bm.num_used_blocks, policy.bm.num_shared_blocks, host_used, policy.num_resident_tokens,
                     0, 0, 0, 0))
        log.extend(rows)
        state["events"] += 1
        if limits.check_invariants:
            policy.check()
        return len(ends)

    def steps():  # noqa: ANN202
        while True:
            if bulk is not None:
                taken = yield from stretch()
                if taken:
                    if limits.max_wall_time_s is not None and time.perf_counter() - wall_start > limits.max_wall_time_s:
                        state["end"] = "max_wall_time"
                        return
                    continue
            plan = policy.schedule(env.now)
            if plan is None:
                if state["arrivals_done"] and not follow_up_times:
                    # Nothing will arrive: not even a follow-up turn, whose parent may never run.
                    if policy.has_work() or state["pending"]:
                        raise ServesimError(_stuck_message(policy, env.now))
                    return
                state["wake"] = env.event()
                yield state["wake"]
                continue
            start = env.now
            duration = cost_model.step_time(plan)
            if not 0 < duration < math.inf:
                raise ServesimError(f"cost model returned step time {duration!r} for step {plan.step_id}; "
                                    "expected a positive finite number of seconds")
            yield env.timeout(duration)
            for request in policy.complete(plan, env.now):
                if children:
                    release_children(request)
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
                    len(policy.running),
                    len(policy.waiting),
                    len(policy.swapped),
                    policy.bm.num_used_blocks,
                    policy.bm.num_shared_blocks,
                    policy.host.num_used_blocks if policy.host is not None else 0,
                    policy.num_resident_tokens,
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
                on_step(env.now)
            if limits.max_wall_time_s is not None and time.perf_counter() - wall_start > limits.max_wall_time_s:
                state["end"] = "max_wall_time"
                return

    env.process(arrivals())
    stepper = env.process(steps())
    until = stepper
    if limits.max_sim_time_s is not None:
        until = env.any_of([stepper, env.timeout(limits.max_sim_time_s)])
    env.run(until=until)
    if not stepper.triggered:
        state["end"] = "max_sim_time"
    unfinished: list[Request] = []
    if state["end"] != "done":
        unfinished = policy.drain_unfinished()
        # Requests that had not arrived yet when the horizon ended are unfinished too.
        for template in ordered:
            if template.request_id not in arrived:
                unfinished.append(dataclasses.replace(template, status=Status.UNFINISHED))
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
        sim_time_s=env.now,
        wall_time_s=time.perf_counter() - wall_start,
        num_events=state["events"],
        itl=policy.itl if hasattr(policy, "itl") else ItlLog(),
    )


# Finished requests handed to `on_finished` at a time.
FLUSH_EVERY = 4096


def _extras(cost_model: CostModel, plan) -> dict[str, float]:  # noqa: ANN001
    """Columns a cost model adds to a step's record: its own measurements, and link time."""
    extras = step_extras(cost_model)
    transfer_time = getattr(cost_model, "transfer_time", None)
    if transfer_time is not None and (plan.blocks_to_swap_in or plan.blocks_to_swap_out):
        extras["transfer_s"] = transfer_time(plan)
    return extras


def _sleep_until(env: simpy.Environment, when: float):  # noqa: ANN202
    """Wait until exactly `when` (env.now + (when - env.now) can round away from `when`)."""
    delay = when - env.now
    while env.now + delay < when:
        delay = math.nextafter(delay, math.inf)
    while env.now + delay > when:
        delay = math.nextafter(delay, -math.inf)
    yield env.timeout(delay)


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
