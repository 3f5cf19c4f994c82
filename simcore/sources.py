"""Where requests come from: SimPy processes that deliver them to a sink (an engine, or a
cluster's router).

`replay` delivers a list of requests at their arrival times (a trace, or a synthetic workload).
`FollowUps` holds multi-turn sessions' later turns: each is released when its parent finishes
(or is rejected) and delivered its think time later, by a small process of its own.
`ClosedLoop` is a fixed number of clients, each sending its next request when its last one
finished (or was rejected), after a think time (`vllm bench serve --max-concurrency`).

A sink counts its open sources: while one is open, more requests may come, so an engine with
nothing to do waits rather than ends.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np
import simpy

from simcore.clock import to_ticks
from simcore.request import Request


class Sink(Protocol):
    """What sources deliver to (an engine, a router)."""

    env: simpy.Environment

    def submit(self, request: Request) -> None: ...
    def open_source(self) -> None: ...
    def close_source(self) -> None: ...


class Releases(Protocol):
    """What hears of a request leaving an engine (finished, or rejected) at `at` seconds."""

    def release(self, request: Request, at: float) -> None: ...


def deliver_at(sink: Sink, request: Request, at: int, in_flight: list[Request]) -> None:
    """`request` reaches `sink` at tick `at` (now or later), held in `in_flight` until then: a
    source of the sink's meanwhile, so an engine waits for it rather than ends."""
    in_flight.append(request)
    sink.open_source()
    sink.env.process(_deliver(sink, request, at, in_flight))


def _deliver(sink: Sink, request: Request, at: int, in_flight: list[Request]) -> Iterator[simpy.Event]:
    if at > sink.env.now:
        yield sink.env.timeout(at - sink.env.now)
    in_flight.remove(request)
    sink.submit(request)
    sink.close_source()


class Delay:
    """A sink that passes each request on to `sink` `delay_s` after it came: the server's time
    before its engine sees a request (HTTP, tokenization; `metrics.frontend_ms`)."""

    def __init__(self, sink: Sink, delay_s: float) -> None:
        self.sink = sink
        self.env = sink.env
        self.delay = to_ticks(delay_s)
        # Come and not yet passed on.
        self._in_flight: list[Request] = []

    def submit(self, request: Request) -> None:
        deliver_at(self.sink, request, self.env.now + self.delay, self._in_flight)

    def open_source(self) -> None:
        self.sink.open_source()

    def close_source(self) -> None:
        self.sink.close_source()

    def undelivered(self) -> list[Request]:
        return list(self._in_flight)


class Replay:
    """Delivers copies of `requests` (in arrival order) to `engine` at their arrival times."""

    def __init__(self, env: simpy.Environment, engine: Sink, requests: Sequence[Request]) -> None:
        self.env = env
        self.engine = engine
        self.requests = requests
        self.num_delivered = 0
        engine.open_source()
        self.process = env.process(self._deliver())

    def _deliver(self) -> Iterator[simpy.Event]:
        env, engine = self.env, self.engine
        for template in self.requests:
            at = to_ticks(template.arrival_s)
            if at > env.now:
                yield env.timeout(at - env.now)
            engine.submit(template.copy())
            self.num_delivered += 1
        engine.close_source()

    def undelivered(self) -> list[Request]:
        """Copies of the requests not delivered yet."""
        return [template.copy() for template in self.requests[self.num_delivered:]]


def replay(env: simpy.Environment, engine: Sink, requests: Sequence[Request]) -> Replay:
    return Replay(env, engine, requests)


class FollowUps:
    """Requests that arrive after another one finishes (`parent_id`, `think_time_s`). A source
    of its sink's while some turn waits for its parent (in a cluster the parent may be on
    another engine than its turn's)."""

    def __init__(self, children: dict[int, list[Request]], timed: list[Request]) -> None:
        # Templates waiting for their parent, by parent id; and the requests that arrive at
        # fixed times (those with no parent in the workload).
        self.children = children
        self.timed = timed
        self.sink: Sink | None = None
        # Released and not yet delivered.
        self._in_flight: list[Request] = []

    @classmethod
    def split(cls, ordered: list[Request]) -> FollowUps | None:
        """The follow-up turns of `ordered` (sorted by arrival), or None when there are none."""
        if all(request.parent_id is None for request in ordered):
            return None
        known = {request.request_id for request in ordered}
        children: dict[int, list[Request]] = {}
        for request in ordered:
            if request.parent_id is not None and request.parent_id in known:
                children.setdefault(request.parent_id, []).append(request)
        timed = [r for r in ordered if r.parent_id is None or r.parent_id not in known]
        return cls(children, timed)

    def deliver_to(self, sink: Sink) -> None:
        self.sink = sink
        if self.children:
            sink.open_source()

    def release(self, parent: Request, at: float) -> None:
        """`parent` finished (or was rejected) at `at`: its follow-ups start their think time.
        One released late (its arrival already past, where a rejection was noticed after it)
        is delivered at once, keeping its arrival time."""
        sink = self.sink
        assert sink is not None
        turns = self.children.pop(parent.request_id, None)
        if turns is None:
            return
        for template in turns:
            child = template.copy()
            child.arrival_s = at + template.think_time_s
            deliver_at(sink, child, to_ticks(child.arrival_s), self._in_flight)
        if not self.children:
            sink.close_source()

    def undelivered(self) -> list[Request]:
        """Turns released and not delivered yet, and copies of those never released."""
        waiting = [template.copy() for turns in self.children.values() for template in turns]
        return [*self._in_flight, *waiting]


class ClosedLoop:
    """`concurrency` clients sending `requests` in order: each client sends one at the start,
    and its next one when its last finishes or is rejected, after a think time (fixed, or drawn
    from an exponential distribution of that mean, `seed`). A request's arrival is when it is
    sent; the arrival times the requests carry are not read."""

    def __init__(self, requests: Sequence[Request], concurrency: int, *, think_time_s: float = 0.0,
                 think_time: str = "fixed", seed: int = 0) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency: expected at least 1 client, found {concurrency}")
        self.sink: Sink | None = None
        self.requests = requests
        self.concurrency = concurrency
        self.think_time_s = think_time_s
        self._rng = np.random.default_rng(seed) if think_time == "exponential" else None
        self.num_sent = 0
        # Requests sent and not yet back (finished or rejected), by id.
        self._out: set[int] = set()
        # Sent after a think time and not yet delivered.
        self._in_flight: list[Request] = []
        self.max_out = 0  # most requests out at once (never more than the clients)

    def deliver_to(self, sink: Sink) -> None:
        """Start: every client sends its first request now."""
        self.sink = sink
        sink.open_source()
        for _ in range(min(self.concurrency, len(self.requests))):
            self._send(0.0)
        if self.num_sent == len(self.requests):
            sink.close_source()

    def release(self, request: Request, at: float) -> None:
        """A client's request came back at `at`: it sends its next one after its think time."""
        if request.request_id not in self._out:
            return
        self._out.remove(request.request_id)
        if self.num_sent < len(self.requests):
            think = self.think_time_s if self._rng is None else float(self._rng.exponential(self.think_time_s))
            self._send(at + think)
            if self.num_sent == len(self.requests):
                self.sink.close_source()  # type: ignore[union-attr]

    def _send(self, at: float) -> None:
        sink = self.sink
        assert sink is not None
        request = self.requests[self.num_sent].copy()
        self.num_sent += 1
        request.arrival_s = at
        self._out.add(request.request_id)
        self.max_out = max(self.max_out, len(self._out))
        deliver_at(sink, request, to_ticks(at), self._in_flight)

    def undelivered(self) -> list[Request]:
        """Requests sent and not delivered yet, and copies of those never sent."""
        return [*self._in_flight, *(template.copy() for template in self.requests[self.num_sent:])]
