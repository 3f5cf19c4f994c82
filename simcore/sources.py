"""Where requests come from: SimPy processes that deliver them to an engine.

`replay` delivers a list of requests at their arrival times (a trace, or a synthetic workload).
`FollowUps` holds multi-turn sessions' later turns: each is released when its parent finishes
(or is rejected) and delivered its think time later, by a small process of its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import simpy

from simcore.clock import to_ticks
from simcore.request import Request

if TYPE_CHECKING:
    from simcore.engine import Engine


class Replay:
    """Delivers copies of `requests` (in arrival order) to `engine` at their arrival times."""

    def __init__(self, env: simpy.Environment, engine: Engine, requests: Sequence[Request]) -> None:
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


def replay(env: simpy.Environment, engine: Engine, requests: Sequence[Request]) -> Replay:
    return Replay(env, engine, requests)


class FollowUps:
    """Requests that arrive after another one finishes (`parent_id`, `think_time_s`)."""

    def __init__(self, children: dict[int, list[Request]], timed: list[Request]) -> None:
        # Templates waiting for their parent, by parent id; and the requests that arrive at
        # fixed times (those with no parent in the workload).
        self.children = children
        self.timed = timed
        self.engine: Engine | None = None
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

    def pending(self) -> bool:
        """Whether some turn waits for a parent still to finish."""
        return bool(self.children)

    def release(self, parent: Request, at: float) -> None:
        """`parent` finished (or was rejected) at `at`: its follow-ups start their think time.
        One released late (its arrival already past, where a rejection was noticed after it)
        is delivered at once, keeping its arrival time."""
        engine = self.engine
        assert engine is not None
        for template in self.children.pop(parent.request_id, ()):
            child = template.copy()
            child.arrival_s = at + template.think_time_s
            self._in_flight.append(child)
            engine.open_source()
            engine.env.process(self._deliver(child))

    def _deliver(self, child: Request) -> Iterator[simpy.Event]:
        engine = self.engine
        assert engine is not None
        at = to_ticks(child.arrival_s)
        if at > engine.env.now:
            yield engine.env.timeout(at - engine.env.now)
        self._in_flight.remove(child)
        engine.submit(child)
        engine.close_source()

    def undelivered(self) -> list[Request]:
        """Turns released and not delivered yet, and copies of those never released."""
        waiting = [template.copy() for turns in self.children.values() for template in turns]
        return [*self._in_flight, *waiting]
