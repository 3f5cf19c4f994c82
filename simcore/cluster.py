"""Replicas behind a router: several engines, one clock, one source of requests.

`simulate_cluster` runs one `Engine` per replica (each its own policy, block manager, cost model
and accelerator) in one SimPy environment. Requests come from a source (`simcore.sources`: a
replayed trace, follow-up turns, closed-loop clients) and reach a `Dispatch`, the router's
process, which asks the router (`Router.choose`, `policies.routers`) for a replica and delivers
the request there, at once or after the router's delay. `simulate` is the one-engine case:
the request goes straight to the engine, as it does to the one replica of a cluster.

A router that reads the replicas' state (queue lengths, free blocks, cached prefixes) first has
each engine `observe`: the state a step-by-step run would show now, whether or not the engine is
taking a run of steps at once (a run is cut there, so results stay identical with and without
acceleration).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import simpy

from simcore.clock import to_seconds, to_ticks
from simcore.engine import (
    Accelerator,
    Engine,
    Policy,
    RunLimits,
    RunResult,
    _collector_for_a_run,
    _stuck_message,
)
from simcore.errors import ServesimError
from simcore.pricing import CostModel
from simcore.request import Request, Status
from simcore.sources import ClosedLoop, FollowUps, Sink, replay
from simcore.steplog import StepLog


class Router(Protocol):
    """Picks the replica each request goes to."""

    # Whether `choose` reads the replicas' state (then every engine observes first).
    reads_state: bool

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        """The index of the replica `request` goes to."""


@dataclass
class Replica:
    """One engine of a cluster, as the caller sets it up."""

    policy: Policy
    cost_model: CostModel
    accelerator: Accelerator | None = None
    on_step: Callable[[float], None] | None = None
    on_finished: Callable[[list[Request]], None] | None = None
    on_progress: Callable[[float, int], None] | None = None
    steps_spill: Path | None = None


@dataclass
class ClusterResult:
    # One result per replica, in order (a request is in the result of the replica it went to).
    replicas: list[RunResult]
    # Requests never delivered to a replica (a time limit ended the run first).
    undelivered: list[Request]
    # The router's decisions, in order: (request id, replica index, seconds).
    decisions: list[tuple[int, int, float]] = field(default_factory=list)
    # Most requests closed-loop clients had out at once (None: open loop).
    max_concurrency: int | None = None
    end_reason: str = "done"
    sim_time_s: float = 0.0
    wall_time_s: float = 0.0


class Dispatch:
    """The router's process: each request goes to the replica the router picks, after its delay."""

    def __init__(self, env: simpy.Environment, engines: list[Engine], router: Router, delay_s: float = 0.0) -> None:
        self.env = env
        self.engines = engines
        self.router = router
        self.delay = to_ticks(delay_s)
        self.decisions: list[tuple[int, int, float]] = []
        self.num_routed = [0] * len(engines)
        # Routed and not yet delivered (the router's delay).
        self._in_flight: list[Request] = []

    def submit(self, request: Request) -> None:
        engines = self.engines
        if len(engines) > 1 and self.router.reads_state:
            for engine in engines:
                engine.observe()
        index = self.router.choose(request, engines) if len(engines) > 1 else 0
        if not 0 <= index < len(engines):
            raise ServesimError(f"router {type(self.router).__name__} chose replica {index} of {len(engines)}")
        self.decisions.append((request.request_id, index, to_seconds(self.env.now)))
        self.num_routed[index] += 1
        target = engines[index]
        if not self.delay:
            target.submit(request)
            return
        target.open_source()
        self._in_flight.append(request)
        self.env.process(self._deliver(target, request))

    def _deliver(self, target: Engine, request: Request) -> Iterator[simpy.Event]:
        yield self.env.timeout(self.delay)
        self._in_flight.remove(request)
        target.submit(request)
        target.close_source()

    def open_source(self) -> None:
        for engine in self.engines:
            engine.open_source()

    def close_source(self) -> None:
        for engine in self.engines:
            engine.close_source()

    def undelivered(self) -> list[Request]:
        return list(self._in_flight)


class ClusterSteps:
    """The replicas' step logs read as one (a `replica` column first), for the writers."""

    spilled = False

    def __init__(self, logs: list[StepLog]) -> None:
        self.logs = logs
        self.extra_totals: dict[str, float] = {}
        for log in logs:
            for key, value in log.extra_totals.items():
                self.extra_totals[key] = self.extra_totals.get(key, 0.0) + value

    def __len__(self) -> int:
        return sum(len(log) for log in self.logs)

    def as_dict(self) -> dict[str, np.ndarray]:
        parts = [log.as_dict() for log in self.logs]
        names = list(dict.fromkeys(name for part in parts for name in part))
        out = {"replica": np.concatenate([np.full(len(log), index, dtype=np.int64) for index, log in enumerate(self.logs)])}
        for name in names:
            out[name] = np.concatenate([part[name] if name in part else np.full(len(log), np.nan)
                                        for part, log in zip(parts, self.logs)])
        return out


def num_outstanding(engine: Engine) -> int:
    """Requests delivered to `engine` that have not left it (queued, running, swapped out, or
    delivered and not yet handed to its policy)."""
    policy = engine.policy
    return len(engine.inbox) + len(policy.waiting) + len(policy.running) + len(policy.swapped)


@dataclass(frozen=True)
class ClosedLoopSpec:
    """Closed-loop clients (`simcore.sources.ClosedLoop`)."""

    concurrency: int
    think_time_s: float = 0.0
    think_time: str = "fixed"
    seed: int = 0


def simulate(
    requests: Sequence[Request],
    policy: Policy,
    cost_model: CostModel,
    *,
    limits: RunLimits | None = None,
    accelerator: Accelerator | None = None,
    on_step: Callable[[float], None] | None = None,
    on_finished: Callable[[list[Request]], None] | None = None,
    on_progress: Callable[[float, int], None] | None = None,
    steps_spill: Path | None = None,
    clients: ClosedLoopSpec | None = None,
) -> RunResult:
    """Replay `requests` through one engine running `policy`, pricing steps with `cost_model`
    (and taking runs of steps at once where `accelerator` extends a planned step).

    The given requests are a template and are never modified: each is copied when it arrives.
    With `on_finished`, finished requests are handed over in batches and not kept, so a long
    run holds only the requests in flight (the result's `finished` then lists none). With
    `steps_spill`, step records go to that Parquet file as the run goes. `on_progress` hears
    (simulated seconds, requests finished) every few hundred events, for a progress bar.
    Follow-up turns (`parent_id`) arrive their think time after their parent finishes (or is
    rejected). With `clients`, closed-loop clients send the requests, in order, instead.
    """
    replica = Replica(policy, cost_model, accelerator, on_step, on_finished, on_progress, steps_spill)
    result = simulate_cluster(requests, [replica], limits=limits, clients=clients)
    return result.replicas[0]


def simulate_cluster(
    requests: Sequence[Request],
    replicas: Sequence[Replica],
    *,
    router: Router | None = None,
    router_delay_s: float = 0.0,
    limits: RunLimits | None = None,
    clients: ClosedLoopSpec | None = None,
) -> ClusterResult:
    """Run `requests` through `replicas` behind `router` (one replica needs none): see the module
    docstring. The requests are a template and are never modified."""
    limits = limits or RunLimits()
    if len(replicas) > 1 and router is None:
        raise ValueError("several replicas need a router")
    with _collector_for_a_run():
        wall_start = time.perf_counter()
        env = simpy.Environment()
        ordered = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        follow_ups = FollowUps.split(ordered)
        if clients is not None and follow_ups is not None:
            raise ValueError("closed-loop clients send requests one after another: a workload with "
                             "follow-up turns (sessions) is not supported with them")
        closed_loop = None
        if clients is not None:
            closed_loop = ClosedLoop(ordered, clients.concurrency, think_time_s=clients.think_time_s,
                                     think_time=clients.think_time, seed=clients.seed)
        releases = closed_loop if closed_loop is not None else follow_ups
        engines = [
            Engine(env, replica.policy, replica.cost_model, accelerator=replica.accelerator, limits=limits,
                   log=StepLog(replica.steps_spill), releases=releases, on_step=replica.on_step,
                   on_finished=replica.on_finished, on_progress=replica.on_progress)
            for replica in replicas
        ]
        dispatch = Dispatch(env, engines, router, router_delay_s) if router is not None else None
        sink: Sink = dispatch if dispatch is not None else engines[0]
        if closed_loop is not None:
            closed_loop.deliver_to(sink)
            sources = [closed_loop]
        else:
            sources = [replay(env, sink, follow_ups.timed if follow_ups is not None else ordered)]
            if follow_ups is not None:
                follow_ups.deliver_to(sink)
                sources.append(follow_ups)
        try:
            env.run(until=env.all_of([engine.process for engine in engines]))
        except RuntimeError as exc:
            if not str(exc).startswith("No scheduled events left"):
                raise
            # Engines wait for requests that only a request stuck in another engine would send.
            stuck = next((engine for engine in engines if engine.policy.has_work()), engines[0])
            raise ServesimError(_stuck_message(stuck.policy, stuck.now_s)) from None
        ends = {engine.end_reason for engine in engines} - {"done"}
        end_reason = min(ends) if ends else "done"
        horizon = engines[0].horizon
        sim_time = horizon if end_reason == "max_sim_time" and horizon is not None else env.now
        undelivered: list[Request] = []
        if end_reason != "done":
            # Requests routed or sent and not delivered to any replica are unfinished too.
            undelivered = [*(dispatch.undelivered() if dispatch is not None else []),
                           *(request for source in sources for request in source.undelivered())]
            for request in undelivered:
                request.status = Status.UNFINISHED
            undelivered.sort(key=lambda r: (r.arrival_s, r.request_id))
        if len(engines) == 1:  # every request is the one replica's
            results, undelivered = [engines[0].result(to_seconds(sim_time), wall_start, undelivered)], []
        else:
            results = [engine.result(to_seconds(sim_time), wall_start) for engine in engines]
        return ClusterResult(
            replicas=results, undelivered=undelivered,
            decisions=dispatch.decisions if dispatch is not None else [],
            max_concurrency=closed_loop.max_in_flight if closed_loop is not None else None,
            end_reason=end_reason, sim_time_s=to_seconds(sim_time), wall_time_s=time.perf_counter() - wall_start,
        )
