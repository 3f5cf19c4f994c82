"""The event loop: the only module that imports SimPy.

Two processes share one SimPy environment: arrivals hand requests to the policy at their
arrival times, and the step loop asks the policy for a plan, advances the clock by the cost
model's price for it, and lets the policy complete it. When nothing can run, the step loop
sleeps until the next arrival.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import simpy

from backends.base import CostModel, step_extras
from simcore.errors import ServesimError
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
    notes: list[str] = field(default_factory=list)

    @property
    def requests(self) -> list[Request]:
        """Every request exactly once, in id order."""
        return sorted([*self.finished, *self.rejected, *self.unfinished], key=lambda r: r.request_id)


def simulate(
    requests: Sequence[Request],
    policy,  # noqa: ANN001 - any object with add/schedule/complete/has_work (see policies.base)
    cost_model: CostModel,
    *,
    limits: RunLimits | None = None,
    on_step: Callable[[float], None] | None = None,
) -> RunResult:
    """Replay `requests` (sorted by arrival) through `policy`, pricing steps with `cost_model`."""
    limits = limits or RunLimits()
    env = simpy.Environment()
    log = StepLog()
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    known = {r.request_id for r in ordered}
    # Follow-up turns wait for their parent to finish; the rest arrive at fixed times.
    children: dict[int, list[Request]] = {}
    for request in ordered:
        if request.parent_id is not None and request.parent_id in known:
            children.setdefault(request.parent_id, []).append(request)
    timed = [r for r in ordered if r.parent_id is None or r.parent_id not in known]
    wall_start = time.perf_counter()
    state = {"arrivals_done": not timed, "pending": sum(len(c) for c in children.values()),
             "wake": env.event(), "end": "done", "events": 0}

    def arrive(request: Request) -> None:
        policy.add(request, env.now)
        state["events"] += 1
        if request.status is Status.REJECTED:
            release_children(request)
        if not state["wake"].triggered:
            state["wake"].succeed()

    def arrivals():  # noqa: ANN202
        for request in timed:
            if request.arrival_s > env.now:
                yield env.timeout(request.arrival_s - env.now)
            arrive(request)
        state["arrivals_done"] = True
        if not state["wake"].triggered:
            state["wake"].succeed()

    def follow_up(request: Request):  # noqa: ANN202
        yield env.timeout(request.think_time_s)
        state["pending"] -= 1
        arrive(request)

    def release_children(parent: Request) -> None:
        for child in children.pop(parent.request_id, ()):
            child.arrival_s = env.now + child.think_time_s
            env.process(follow_up(child))

    def steps():  # noqa: ANN202
        while True:
            plan = policy.schedule(env.now)
            if plan is None:
                if state["arrivals_done"] and state["pending"] == 0:
                    if policy.has_work():
                        raise ServesimError(_stuck_message(policy, env.now))
                    return
                state["wake"] = env.event()
                yield state["wake"]
                continue
            start = env.now
            duration = cost_model.step_time(plan)
            if not duration > 0:
                raise ServesimError(f"cost model returned a non-positive step time {duration!r} for step {plan.step_id}")
            yield env.timeout(duration)
            for request in policy.complete(plan, env.now):
                if children:
                    release_children(request)
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
                step_extras(cost_model),
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
        added = {r.request_id for r in (*policy.finished, *policy.rejected, *unfinished)}
        # Requests that had not arrived yet when the horizon ended are unfinished too.
        for request in ordered:
            if request.request_id not in added:
                request.status = Status.UNFINISHED
                unfinished.append(request)
    return RunResult(
        finished=list(policy.finished),
        rejected=list(policy.rejected),
        unfinished=unfinished,
        steps=log,
        end_reason=state["end"],
        sim_time_s=env.now,
        wall_time_s=time.perf_counter() - wall_start,
        num_events=state["events"],
    )


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
