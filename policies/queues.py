"""The waiting queue, and the orders it can keep (a policy's `queue_order`).

A queue order is a sort key: admission takes requests in key order, a request preempted for
recompute goes back by its order's rule, and whether a new arrival could be taken before the
request at the head is a comparison of keys, so an accelerator can ask it without knowing the
order (`WaitingQueue.would_lead`). Orders:

- `fcfs` (default): arrival order; a preempted request goes back to the head (vLLM's FCFS).
- `priority`: the request's `priority`, lower first, then arrival (vLLM's priority scheduling);
  a preempted request goes back by its key, and when blocks run out the running request of
  lowest priority (latest arrival at a tie) is the victim, as in vLLM v1.
- `shortest_prompt_first`: fewest known tokens first (prompt, and outputs for a recompute),
  then arrival.
- `longest_prefix_match`: SGLang's `lpm`: before each step, the queue is sorted by the length
  of each request's prefix already in the device cache, longest first, arrival order breaking
  ties (a stable sort); like SGLang, it falls back to arrival order while more than 128 requests
  wait (sglang/srt/managers/schedule_policy.py, `_determine_active_policy`), and without a
  prefix cache it is arrival order. SGLang's in-batch deprioritisation of requests that share
  a prefix with another waiting one is not modelled.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator
from itertools import count

from simcore.request import Request

# Sort keys: tuples compared element by element.
Key = tuple

QUEUE_ORDERS = ("fcfs", "priority", "shortest_prompt_first", "longest_prefix_match")
# SGLang's limit above which longest-prefix-match sorting is off (the queue is taken in arrival order).
MAX_QUEUE_SORTED_BY_PREFIX = 128


class QueueOrder:
    """First come, first served: the base every order refines."""

    name = "fcfs"
    # Keys change as the prefix cache does (sorted again before each step).
    keys_change = False

    def __init__(self) -> None:
        self._arrivals = count()

    def arrival_key(self, request: Request) -> Key:
        """The key of a request joining the queue on arrival (`seq`: arrival order)."""
        return (1, next(self._arrivals))

    def preempted_key(self, request: Request) -> Key:
        """The key of a request put back after a preemption for recompute: ahead of every
        arrival, the latest preempted first (vLLM prepends it)."""
        return (0, -next(self._arrivals))

    def pick_victim(self, running: list[Request], exclude: set[int]) -> Request | None:
        """The running request to preempt when blocks run out, among those not in `exclude`
        (already in the step): the newest (vLLM's FCFS)."""
        for candidate in reversed(running):
            if candidate.request_id not in exclude:
                return candidate
        return None


class PriorityOrder(QueueOrder):
    name = "priority"

    def arrival_key(self, request: Request) -> Key:
        return (request.priority, request.arrival_s, request.request_id)

    def preempted_key(self, request: Request) -> Key:
        return self.arrival_key(request)

    def pick_victim(self, running: list[Request], exclude: set[int]) -> Request | None:
        candidates = [request for request in running if request.request_id not in exclude]
        if not candidates:
            return None
        return max(candidates, key=self.arrival_key)


class ShortestPromptFirstOrder(QueueOrder):
    name = "shortest_prompt_first"

    def arrival_key(self, request: Request) -> Key:
        return (request.num_tokens, next(self._arrivals))

    def preempted_key(self, request: Request) -> Key:
        return self.arrival_key(request)


class LongestPrefixMatchOrder(QueueOrder):
    """Arrival order refined by each request's cached prefix, sorted before each step (see
    `WaitingQueue.sort_by_prefix`); the keys here are the arrival-order part."""

    name = "longest_prefix_match"

    def __init__(self, *, prefix_caching: bool) -> None:
        super().__init__()
        self.keys_change = prefix_caching


def make_order(name: str, *, prefix_caching: bool = False) -> QueueOrder:
    if name not in QUEUE_ORDERS:
        raise ValueError(f"queue_order must be one of {list(QUEUE_ORDERS)}, got {name!r}")
    if name == "longest_prefix_match":
        return LongestPrefixMatchOrder(prefix_caching=prefix_caching)
    return {"fcfs": QueueOrder, "priority": PriorityOrder, "shortest_prompt_first": ShortestPromptFirstOrder}[name]()


class WaitingQueue:
    """Requests waiting to be admitted, in the order admission takes them (their keys')."""

    def __init__(self, order: QueueOrder) -> None:
        self.order = order
        self._keys: list[Key] = []
        self._requests: list[Request] = []

    def __len__(self) -> int:
        return len(self._requests)

    def __bool__(self) -> bool:
        return bool(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)

    def __getitem__(self, index: int) -> Request:
        return self._requests[index]

    def __contains__(self, request: Request) -> bool:
        return any(queued is request for queued in self._requests)

    def add(self, request: Request) -> None:
        """A request joins on arrival."""
        self._insert(self.order.arrival_key(request), request)

    def add_preempted(self, request: Request) -> None:
        """A request preempted for recompute goes back."""
        self._insert(self.order.preempted_key(request), request)

    def remove(self, request: Request) -> None:
        index = next(i for i, queued in enumerate(self._requests) if queued is request)
        del self._keys[index], self._requests[index]

    def would_lead(self, request: Request) -> bool:
        """Whether `request`, arriving now, would be ahead of the request at the head (or be
        the head of an empty queue): the one thing an accelerator asks of the order. Where keys
        change with the cache, any arrival might."""
        if not self._requests or self.order.keys_change:
            return True
        # A trial key: orders that number arrivals skip a number, which orders nothing.
        return self.order.arrival_key(request) < self._keys[0]

    def sort_by_prefix(self, cached_positions: Callable[[Request], int]) -> None:
        """Longest prefix match, before a step: the queue sorted by each request's cached prefix
        (positions, longest first), then by key; by key alone above MAX_QUEUE_SORTED_BY_PREFIX
        requests."""
        if not self.order.keys_change:
            return
        pairs = list(zip(self._keys, self._requests))
        if len(pairs) > MAX_QUEUE_SORTED_BY_PREFIX:
            pairs.sort(key=lambda pair: pair[0])
        else:
            pairs.sort(key=lambda pair: (-cached_positions(pair[1]), pair[0]))
        self._keys = [key for key, _ in pairs]
        self._requests = [request for _, request in pairs]

    def _insert(self, key: Key, request: Request) -> None:
        # Where keys change with the cache the queue is sorted before each step: appended here.
        index = len(self._keys) if self.order.keys_change else bisect_right(self._keys, key)
        self._keys.insert(index, key)
        self._requests.insert(index, request)
