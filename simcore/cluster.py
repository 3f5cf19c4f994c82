"""Replicas behind a router: several engines, one clock, one source of requests.

`simulate_cluster` runs one `Engine` per replica (each its own policy, block manager, cost model
and accelerator) in one SimPy environment. Requests come from a source (`simcore.sources`: a
replayed trace, follow-up turns, closed-loop clients) and reach a `Dispatch`, the router's
process, which asks the router (`Router.choose`, `policies.routers`) for a replica and delivers
the request there, at once or after the router's delay. `simulate` is the one-engine case:
the request goes straight to the engine, as it does to the one replica of a cluster.

A router that reads the replicas' state (free blocks, cached prefixes) first has each engine
`observe`: the state a step-by-step run would show now, whether or not the engine is taking a
run of steps at once (a run is cut there, so results stay identical with and without
acceleration). One that reads only their load (`Engine.num_outstanding`) cuts nothing: that
count is exact in a run under way.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import simpy

from simcore.clock import duration_ticks, to_seconds, to_ticks
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
from simcore.presets import LinkSpec
from simcore.pricing import CostModel
from simcore.request import Request, Status
from simcore.sources import ClosedLoop, Delay, FollowUps, Releases, Sink, deliver_at, replay
from simcore.steplog import StepLog


class Router(Protocol):
    """Picks the replica each request goes to."""

    # What `choose` reads of the replicas: "nothing"; "load", their `Engine.num_outstanding`
    # alone (exact without cutting a run); or "state", anything (then every engine observes first).
    reads: str

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
    # KV transfers of a disaggregated cluster, in the order they ended.
    transfers: list[Transfer] = field(default_factory=list)
    # Most requests closed-loop clients had out at once (None: open loop).
    max_concurrency: int | None = None
    end_reason: str = "done"
    sim_time_s: float = 0.0
    wall_time_s: float = 0.0


class Dispatch:
    """The router's process: each request goes to the replica the router picks, after its delay.
    Replica indices in its decisions start at `first_index` (a disaggregated cluster's decode
    replicas come after its prefill replicas)."""

    def __init__(self, env: simpy.Environment, engines: list[Engine], router: Router, delay_s: float = 0.0,
                 first_index: int = 0) -> None:
        self.env = env
        self.engines = engines
        self.router = router
        self.delay = to_ticks(delay_s)
        self.first_index = first_index
        self.decisions: list[tuple[int, int, float]] = []
        # Routed and not yet delivered (the router's delay).
        self._in_flight: list[Request] = []

    def submit(self, request: Request) -> None:
        self.deliver(self.route(request), request, self.delay)

    def route(self, request: Request) -> int:
        """The replica the router picks for `request` now (an index into `engines`)."""
        engines = self.engines
        if len(engines) > 1 and self.router.reads == "state":
            for engine in engines:
                engine.observe()
        index = self.router.choose(request, engines) if len(engines) > 1 else 0
        if not 0 <= index < len(engines):
            raise ServesimError(f"router {type(self.router).__name__} chose replica {index} of {len(engines)}")
        self.decisions.append((request.request_id, self.first_index + index, to_seconds(self.env.now)))
        return index

    def deliver(self, index: int, request: Request, delay: int = 0) -> None:
        """`request` reaches replica `index` after `delay` ticks."""
        target = self.engines[index]
        if not delay:
            target.submit(request)
            return
        deliver_at(target, request, self.env.now + delay, self._in_flight)

    def open_source(self) -> None:
        for engine in self.engines:
            engine.open_source()

    def close_source(self) -> None:
        for engine in self.engines:
            engine.close_source()

    def undelivered(self) -> list[Request]:
        return list(self._in_flight)


@dataclass(frozen=True)
class Disaggregation:
    """Prefill and decode on separate replicas: the first `num_prefill` replicas prefill each
    request (to its first output); its KV then moves over that replica's link (`link_concurrency`
    transfers at once, the rest queue) to a decode replica `decode_router` picks, which
    continues it. A transfer moves the blocks holding the prompt, `block_bytes` each (one
    number, or one for each prefill replica, whose parallelism may differ)."""

    num_prefill: int
    decode_router: Router
    link: LinkSpec
    block_bytes: int | tuple[int, ...]
    link_concurrency: int = 1

    def bytes_per_block(self, prefill_index: int) -> int:
        """What a KV block holds on prefill replica `prefill_index`."""
        return self.block_bytes if isinstance(self.block_bytes, int) else self.block_bytes[prefill_index]


@dataclass
class Transfer:
    """One request's KV moved from a prefill replica to a decode replica (seconds)."""

    request_id: int
    prefill_replica: int
    decode_replica: int
    num_blocks: int
    # Its prefill's end (it waited for the link until `start_s`), and when the KV arrived.
    ready_s: float
    start_s: float
    end_s: float


class KVTransfers:
    """A disaggregated cluster between its two sides: the source's requests go to the prefill
    replicas as prefill legs (`Request.prefill_leg`); a finished leg's replica holds its blocks
    until its KV has crossed the link, and the request continues on a decode replica
    (`Request.decode_leg`), its first output delivered when the KV arrives. The decode side
    stays open while any request is on the prefill side or on a link."""

    def __init__(self, env: simpy.Environment, prefill: Dispatch, decode: Dispatch, spec: Disaggregation,
                 releases: Releases | None) -> None:
        self.env = env
        self.prefill = prefill
        self.decode = decode
        self.spec = spec
        # What hears of requests leaving the cluster (follow-up turns, clients).
        self.releases = releases
        self.links = [simpy.Resource(env, capacity=spec.link_concurrency) for _ in prefill.engines]
        self.transfers: list[Transfer] = []
        # Requests on the prefill side: id -> (the request as sent, its prefill replica).
        self._in_prefill: dict[int, tuple[Request, int]] = {}
        self._on_link: list[Request] = []

    # ---- a sink, for the sources ----------------------------------------------------------

    def submit(self, request: Request) -> None:
        if self.decode.engines[0].policy.rejection_reason(request) is not None:
            # Too long for a decode replica: refused there at once, not prefilled first.
            self.decode.deliver(self.decode.route(request), request)
            return
        self.decode.open_source()  # (until it reaches the decode side, or ends on the prefill side)
        leg = request.prefill_leg()
        index = self.prefill.route(leg)
        self._in_prefill[request.request_id] = (request, index)
        self.prefill.deliver(index, leg, self.prefill.delay)

    def open_source(self) -> None:
        self.prefill.open_source()
        self.decode.open_source()

    def close_source(self) -> None:
        self.prefill.close_source()
        self.decode.close_source()

    # ---- releases, from the replicas -------------------------------------------------------

    def release(self, request: Request, at: float) -> None:
        """A request left a replica: a prefill leg with outputs to go moves to the decode side,
        its prefill replica holding its blocks until the KV has crossed; anything else (a decode
        leg, a request with one output, or one rejected) has left the cluster."""
        entry = self._in_prefill.pop(request.request_id, None)
        if entry is not None:
            template, source = entry
            if request.status is Status.FINISHED:
                if template.num_target_outputs > 1:
                    self._start_transfer(source, request, template)
                    return
                self.prefill.engines[source].policy.release_held(request.request_id)
            self.decode.close_source()
        if self.releases is not None:
            self.releases.release(request, at)

    def _start_transfer(self, source: int, leg: Request, template: Request) -> None:
        engine = self.prefill.engines[source]
        # Until the blocks it holds are free, the replica waits for them rather than ending.
        engine.open_source()
        self._on_link.append(leg)
        num_blocks = engine.policy.bm.blocks_for(leg.num_processed)
        self.env.process(self._transfer(source, self.decode.route(leg), leg, template, num_blocks))

    def _transfer(self, source: int, target: int, leg: Request, template: Request,
                  num_blocks: int) -> Iterator[simpy.Event]:
        ready = self.env.now
        with self.links[source].request() as slot:
            yield slot
            start = self.env.now
            link = self.spec.link
            num_bytes = num_blocks * self.spec.bytes_per_block(source)
            yield self.env.timeout(duration_ticks(link.latency_s + num_bytes / link.bytes_per_s))
        # The prefill replica's blocks are free now: what it plans next may use them.
        engine = self.prefill.engines[source]
        engine.observe()
        engine.policy.release_held(leg.request_id)
        engine.close_source()  # (wakes it)
        self._on_link.remove(leg)
        arrived = self.env.now
        self.transfers.append(Transfer(leg.request_id, self.prefill.first_index + source,
                                       self.decode.first_index + target, num_blocks, to_seconds(ready),
                                       to_seconds(start), to_seconds(arrived)))
        self.decode.deliver(target, leg.decode_leg(template, to_seconds(arrived)))
        self.decode.close_source()

    def undelivered(self) -> list[Request]:
        """Requests on a link (their prefill done)."""
        return [*self._on_link, *self.decode.undelivered()]


class Timeouts:
    """Clients that give up: a request not finished `timeout_s` after it reached the cluster
    leaves the replica it is on (`Engine.cancel`, its blocks freed) or, still in the router's
    delay, never joins one; then its client hears it is back (`releases`). A sink between the
    sources and the cluster."""

    def __init__(self, env: simpy.Environment, sink: Sink, engines: list[Engine], timeout_s: float,
                 releases: Releases | None) -> None:
        self.env = env
        self.sink = sink
        self.engines = engines
        self.timeout = to_ticks(timeout_s)  # (a huge one means never: to_ticks counts any)
        self.releases = releases
        # (deadline, request) in the order the requests came: deadlines come in that order too.
        self._pending: deque[tuple[int, Request]] = deque()
        self._more: simpy.Event | None = None
        env.process(self._watch())

    def submit(self, request: Request) -> None:
        self._pending.append((self.env.now + self.timeout, request))
        if self._more is not None and not self._more.triggered:
            self._more.succeed()
        self.sink.submit(request)

    def open_source(self) -> None:
        self.sink.open_source()

    def close_source(self) -> None:
        self.sink.close_source()

    def _watch(self) -> Iterator[simpy.Event]:
        env, pending = self.env, self._pending
        while True:
            if not pending:
                self._more = env.event()
                yield self._more
                continue
            deadline, request = pending[0]
            if deadline > env.now:
                yield env.timeout(deadline - env.now)
            pending.popleft()
            if request.status in _LEFT:
                continue
            if not any(engine.cancel(request) for engine in self.engines):
                request.status = Status.TIMED_OUT  # the replica it reaches counts it (`Engine.submit`)
                request.finish_s = to_seconds(env.now)
            if request.status is Status.TIMED_OUT and self.releases is not None:
                self.releases.release(request, to_seconds(env.now))


# What a request is once it has left the engine that served it.
_LEFT = (Status.FINISHED, Status.REJECTED)


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


class ClientsRefuseWorkload(ValueError):
    """Closed-loop clients with a workload they cannot send (one with follow-up turns)."""


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
    timeout_s: float | None = None,
    frontend_s: float = 0.0,
) -> RunResult:
    """Replay `requests` through one engine running `policy`, pricing steps with `cost_model`
    (and taking runs of steps at once where `accelerator` extends a planned step).

    The given requests are a template and are never modified: each is copied when it arrives.
    With `on_finished`, finished requests are handed over in batches and not kept, so a long
    run holds only the requests in flight (the result's `finished` then lists none). With
    `steps_spill`, step records go to that Parquet file as the run goes. `on_progress` hears
    (simulated seconds, requests finished) every few hundred events, for a progress bar.
    Follow-up turns (`parent_id`) arrive their think time after their parent finishes (or is
    rejected). With `clients`, closed-loop clients send the requests, in order, instead. With
    `timeout_s`, a request not finished that long after it arrived is given up (`Timeouts`); with
    `frontend_s`, each reaches the engine that long after it arrived (`Delay`).
    """
    replica = Replica(policy, cost_model, accelerator, on_step, on_finished, on_progress, steps_spill)
    result = simulate_cluster(requests, [replica], limits=limits, clients=clients, timeout_s=timeout_s,
                              frontend_s=frontend_s)
    return result.replicas[0]


def simulate_cluster(
    requests: Sequence[Request],
    replicas: Sequence[Replica],
    *,
    router: Router | None = None,
    router_delay_s: float = 0.0,
    limits: RunLimits | None = None,
    clients: ClosedLoopSpec | None = None,
    disaggregation: Disaggregation | None = None,
    timeout_s: float | None = None,
    frontend_s: float = 0.0,
) -> ClusterResult:
    """Run `requests` through `replicas` behind `router` (one replica needs none): see the module
    docstring. With `disaggregation`, its first `num_prefill` replicas prefill and the others
    decode (`KVTransfers`); `router` picks among the prefill replicas. With `timeout_s`, clients
    give up on a request not finished that long after it arrived (`Timeouts`; not with
    `disaggregation`); with `frontend_s`, each request reaches the router that long after it
    arrived (`Delay`: a server's HTTP and tokenization). The requests are a template and are
    never modified."""
    limits = limits or RunLimits()
    if len(replicas) > 1 and router is None:
        raise ValueError("several replicas need a router")
    if disaggregation is not None and timeout_s is not None:
        raise ValueError("client timeouts are not modelled in a disaggregated cluster")
    if disaggregation is not None and not 0 < disaggregation.num_prefill < len(replicas):
        raise ValueError(f"a disaggregated cluster needs prefill and decode replicas: {disaggregation.num_prefill} "
                         f"of {len(replicas)} prefill")
    with _collector_for_a_run():
        wall_start = time.perf_counter()
        env = simpy.Environment()
        ordered = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        follow_ups = FollowUps.split(ordered)
        if clients is not None and follow_ups is not None:
            raise ClientsRefuseWorkload("closed-loop clients send requests one after another: a workload with "
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
        transfers = None
        if disaggregation is not None:
            split = disaggregation.num_prefill
            dispatch = Dispatch(env, engines[:split], router, router_delay_s)  # type: ignore[arg-type]
            transfers = KVTransfers(env, dispatch, Dispatch(env, engines[split:], disaggregation.decode_router,
                                                            first_index=split), disaggregation, releases)
            for engine in engines[:split]:
                engine.releases = transfers
                engine.policy.holds_finished_blocks = True
        else:
            dispatch = Dispatch(env, engines, router, router_delay_s) if router is not None else None
        sink: Sink = transfers or dispatch or engines[0]
        frontend = Delay(sink, frontend_s) if frontend_s else None
        sink = frontend or sink
        if timeout_s is not None:
            sink = Timeouts(env, sink, engines, timeout_s, releases)
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
            # Engines wait for requests that only another engine would send: one a time limit
            # stopped (the run ends there for all), or one stuck.
            stopped = next((engine.end_reason for engine in engines if engine.end_reason != "done"), None)
            if stopped is None:
                stuck = next((engine for engine in engines if engine.policy.has_work()), engines[0])
                raise ServesimError(_stuck_message(stuck.policy, stuck.now_s)) from None
            for engine in engines:
                if engine.process.is_alive:
                    engine.end_reason = stopped
        ends = {engine.end_reason for engine in engines} - {"done"}
        end_reason = min(ends) if ends else "done"
        horizon = engines[0].horizon
        sim_time = horizon if end_reason == "max_sim_time" and horizon is not None else env.now
        undelivered: list[Request] = []
        if end_reason != "done":
            # Requests routed or sent and not delivered to any replica are unfinished too.
            undelivered = [*(frontend.undelivered() if frontend is not None else []),
                           *(dispatch.undelivered() if dispatch is not None else []),
                           *(transfers.undelivered() if transfers is not None else []),
                           *(request for source in sources for request in source.undelivered())]
            for request in undelivered:
                request.status = Status.UNFINISHED
            undelivered.sort(key=lambda r: (r.arrival_s, r.request_id))
        if len(engines) == 1:  # every request is the one replica's
            results, undelivered = [engines[0].result(to_seconds(sim_time), wall_start, undelivered)], []
        else:
            results = [engine.result(to_seconds(sim_time), wall_start) for engine in engines]
        decisions = dispatch.decisions if dispatch is not None else []
        if transfers is not None:
            # A request is in the result of the replica it ended on.
            moved = {transfer.request_id for transfer in transfers.transfers}
            for result in results[:disaggregation.num_prefill]:  # type: ignore[union-attr]
                result.finished = [request for request in result.finished if request.request_id not in moved]
            decisions = sorted([*decisions, *transfers.decode.decisions], key=lambda d: d[2])
        return ClusterResult(
            replicas=results, undelivered=undelivered, decisions=decisions,
            transfers=transfers.transfers if transfers is not None else [],
            max_concurrency=closed_loop.max_out if closed_loop is not None else None,
            end_reason=end_reason, sim_time_s=to_seconds(sim_time), wall_time_s=time.perf_counter() - wall_start,
        )
