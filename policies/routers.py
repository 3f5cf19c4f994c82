"""Routers: which replica of a cluster each request goes to (`simcore.cluster`).

Each is a small class with `choose(request, replicas)` and what it `reads` of the replicas:
nothing, their load (requests in flight, `Engine.num_outstanding`), or their state (free blocks,
cached prefixes), each as a step-by-step run would show it now (`simcore.cluster`). Ties go to the
lowest index, so every choice is deterministic; `random` and `power_of_two` draw from their own
generator, seeded by the experiment.

- `round_robin`: replicas in turn.
- `random`: uniformly at random.
- `least_outstanding`: fewest requests in flight (queued, running, swapped out or on their
  way), as Vidur's and vLLM's router's "least outstanding requests".
- `least_kv`: most free KV blocks.
- `power_of_two`: two replicas drawn at random, the one with fewer requests in flight
  (Mitzenmacher's power of two choices).
- `session_affinity`: every turn of a session on the replica its first turn went to (chosen
  round robin among sessions); requests without a session round robin.
- `prefix_aware`: the best score of `prefix_weight` x (share of the prompt the replica's
  prefix cache holds) + `load_weight` x (queue score: 1 for the replica with the fewest
  requests in flight, 0 for the most, linear between), in the manner of llm-d's
  prefix-cache and queue scorers and Dynamo's KV router (cached-prefix overlap against load).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simcore.engine import Engine
from simcore.request import Request


class Router:
    """A router's common ground: how many replicas, and the experiment's seed."""

    # What `choose` reads of the replicas: "nothing", "load" or "state" (simcore.cluster.Router).
    reads = "nothing"

    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        self.num_replicas = num_replicas
        self.seed = seed

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        raise NotImplementedError


class RoundRobin(Router):
    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        super().__init__(num_replicas, seed)
        self.next = 0

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        index = self.next
        self.next = (index + 1) % self.num_replicas
        return index


class Random(Router):
    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        super().__init__(num_replicas, seed)
        self.rng = np.random.default_rng(seed)

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        return int(self.rng.integers(self.num_replicas))


class LeastOutstanding(Router):
    reads = "load"

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        loads = [engine.num_outstanding() for engine in replicas]
        return loads.index(min(loads))


class LeastKV(Router):
    reads = "state"

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        free = [engine.policy.bm.num_free_blocks for engine in replicas]
        return free.index(max(free))


class PowerOfTwo(Router):
    reads = "load"

    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        super().__init__(num_replicas, seed)
        self.rng = np.random.default_rng(seed)

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        first, second = (int(i) for i in self.rng.choice(len(replicas), size=2, replace=False))
        return first if replicas[first].num_outstanding() <= replicas[second].num_outstanding() else second


class SessionAffinity(Router):
    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        super().__init__(num_replicas, seed)
        self.turn_order = RoundRobin(num_replicas)
        self.by_session: dict[str, int] = {}

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        session = request.session_id
        if session is None:
            return self.turn_order.choose(request, replicas)
        if session not in self.by_session:
            self.by_session[session] = self.turn_order.choose(request, replicas)
        return self.by_session[session]


class PrefixAware(Router):
    reads = "state"

    def __init__(self, num_replicas: int, seed: int = 0, *, prefix_weight: float = 1.0,
                 load_weight: float = 1.0) -> None:
        super().__init__(num_replicas, seed)
        self.prefix_weight = prefix_weight
        self.load_weight = load_weight

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        loads = [engine.num_outstanding() for engine in replicas]
        least, most = min(loads), max(loads)
        scores = []
        for engine, load in zip(replicas, loads):
            cached = engine.policy.cached_prefix_positions(request, remember=False) / request.prompt_len
            queue = 1.0 if most == least else (most - load) / (most - least)
            scores.append(self.prefix_weight * cached + self.load_weight * queue)
        return scores.index(max(scores))


# Router name -> class (built with the number of replicas and the router's own parameters).
ROUTERS: dict[str, type[Router]] = {
    "round_robin": RoundRobin,
    "random": Random,
    "least_outstanding": LeastOutstanding,
    "least_kv": LeastKV,
    "power_of_two": PowerOfTwo,
    "session_affinity": SessionAffinity,
    "prefix_aware": PrefixAware,
}
# Each router's own parameters (checked by the experiment's schema).
ROUTER_PARAMS: dict[str, tuple[str, ...]] = {"prefix_aware": ("prefix_weight", "load_weight")}


def make_router(name: str, num_replicas: int, *, seed: int = 0, **params: float) -> Router:
    """A router by name (`ROUTERS`), with its own parameters (`ROUTER_PARAMS`)."""
    return ROUTERS[name](num_replicas, seed, **params)
