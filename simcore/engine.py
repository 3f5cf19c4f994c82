"""The serving engine as a SimPy process: plan a step, sleep for its price, complete it.

`Engine` is one replica: requests are delivered to it (`submit`) by arrival processes
(`simcore.sources`); before each step it hands the policy every request delivered so far, asks
it for a plan, sleeps for the cost model's price of that plan, and completes it. An accelerator
(`policies.accelerate`), when given, may extend a planned step with the steps that are certain
to follow it (a `Run`): the engine prices them a lookahead at a time and sleeps through them; a
request delivered meanwhile cuts the run where it could change it (`Run.steps_kept`), and so
does a reader of the engine's state (`observe`); else the run ends at its own end or at the
horizon. `simcore.cluster` replays requests through one engine (`simulate`), or several behind
a router.

The clock counts femtoseconds (`simcore.clock`); the engine's wake-ups come after everything
else due at the same instant (`_late`), so a step that starts when a request arrives sees it.
"""

from __future__ import annotations

import gc
import math
import sys
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Protocol

import simpy
from simpy.events import Event

from simcore.clock import InvalidDuration, duration_ticks, durations_ticks, to_seconds, to_ticks
from simcore.errors import ServesimError
from simcore.itl import ItlLog
from simcore.plan import Repeat, StepPlan
from simcore.pricing import CostModel, repeat_times, step_extras
from simcore.request import Request, Status
from simcore.sources import Releases
from simcore.steplog import StepLog, StepRecord


class Policy(Protocol):
    """What the engine needs of a scheduling policy (`policies.base.Scheduler` is one)."""

    waiting: Sequence[Request]
    running: list[Request]
    swapped: Sequence[Request]
    finished: list[Request]
    rejected: list[Request]
    timed_out: list[Request]
    by_id: dict[int, Request]
    itl: ItlLog
    num_resident_tokens: int

    def add(self, request: Request, now: float) -> None: ...
    def schedule(self, now: float) -> StepPlan | None: ...
    def complete(self, plan: StepPlan, now: float) -> list[Request]: ...
    def cancel(self, request: Request, now: float) -> None: ...
    def has_work(self) -> bool: ...
    def drain_unfinished(self) -> list[Request]: ...
    def check(self) -> None: ...
    def check_drained(self) -> None: ...


class Run(Protocol):
    """Steps after a planned one whose shapes an accelerator knows before they start."""

    # Most steps the run may take (it may be cut sooner).
    num_steps: int

    def repeats(self) -> Iterator[Repeat]:
        """The run's steps as plans and their repeats, in order (priced as the clock reaches them)."""

    def steps_kept(self, request: Request, step: int) -> int:
        """How many of the run's steps stay as planned when `request` is delivered before step
        `step` (from 0) starts (at least `step`: those before it are under way): it only joins
        the queue until then."""

    def num_leaving(self, num_steps: int) -> int:
        """How many requests finish in the run's first `num_steps` steps."""

    def apply(self, step_ends: list[float]) -> tuple[list[Request], StepRecord]:
        """Complete the run's first len(step_ends) steps (their end times, seconds): the
        requests that finished, and the steps' record columns (step ids, starts, durations and
        the queue's length are the engine's)."""


class Accelerator(Protocol):
    def extend(self, plan: StepPlan, finished: list[Request], *, closed_loop: bool) -> Run | None:
        """The steps certain to follow `plan` (completed: the policy's state is the one it
        leaves; `finished` left in it), or None. With `closed_loop`, a finish releases requests
        (follow-up turns, a closed-loop client's next): a run ends at its first finish, and
        every delivery cuts it."""


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
    # Planned steps and runs taken (a run of steps counts once).
    num_events: int = 0
    itl: ItlLog = field(default_factory=ItlLog)
    # Requests whose clients gave up on them (`clients.timeout_s`).
    timed_out: list[Request] = field(default_factory=list)

    @property
    def requests(self) -> list[Request]:
        """Every request exactly once, in id order."""
        return sorted([*self.finished, *self.rejected, *self.timed_out, *self.unfinished], key=lambda r: r.request_id)


# What a request is while an engine's policy holds it.
_HELD = (Status.WAITING, Status.RUNNING, Status.SWAPPED)
# SimPy event priorities: 0 urgent, 1 normal; the engine's own wake-ups come after both.
_LATE = 2
# Finished requests handed to `on_finished` at a time.
FLUSH_EVERY = 4096
# Events between two calls of `on_progress` (a callback that checks the wall clock itself).
PROGRESS_EVERY = 256
# Most steps of a run priced at once (`_lookahead`).
MAX_LOOKAHEAD = 4096
# Steps a lookahead prices at least once an event has not cut the run (another replica's step,
# a request that waits), then twice as many after each such event: a long run wakes rarely.
MIN_LOOKAHEAD_UNCUT = 16
# New containers between the collector's young passes during a run (see `_collector_for_a_run`).
GC_YOUNG_THRESHOLD = 100_000


@dataclass
class _OpenRun:
    """A run whose steps are being taken: the run, the planned step's end, the most steps it may
    take, how much of the inbox it has seen, and the steps taken (their ends, ticks).
    `finished` is set once `Engine.observe` has completed its steps."""

    run: Run
    end: int
    limit: int
    seen: int
    closed_loop: bool
    ends: list[int] = field(default_factory=list)
    finished: list[Request] | None = None
    # Whether the engine sleeps until the steps taken end (a cut must wake it sooner).
    sleeping: bool = False

    @property
    def taken_until(self) -> int:
        """When the steps taken end."""
        return self.ends[-1] if self.ends else self.end


class _Late(Event):
    """A timeout processed after every other event due at the same instant (arrivals, releases,
    whatever they start), so a step that starts when a request is delivered sees it."""

    def __init__(self, env: simpy.Environment, delay: int) -> None:
        super().__init__(env)
        # Triggered now, processed at now + delay (as simpy's Timeout sets itself up).
        self._ok, self._value = True, None
        env.schedule(self, _LATE, delay)


class Engine:
    """One serving engine: a SimPy process over a policy, a cost model and (optionally) an
    accelerator. Requests reach it through `submit`; sources say when they are done."""

    def __init__(self, env: simpy.Environment, policy: Policy, cost_model: CostModel, *,
                 accelerator: Accelerator | None = None, limits: RunLimits | None = None,
                 log: StepLog | None = None, releases: Releases | None = None,
                 on_step: Callable[[float], None] | None = None,
                 on_finished: Callable[[list[Request]], None] | None = None,
                 on_progress: Callable[[float, int], None] | None = None) -> None:
        self.env = env
        self.policy = policy
        self.cost_model = cost_model
        # With a per-step callback every step is its own.
        self.accelerator = accelerator if on_step is None else None
        self.limits = limits or RunLimits()
        self.log = log if log is not None else StepLog()
        # What hears of requests leaving (finished or rejected): follow-up turns, clients.
        self.releases = releases
        self.on_step = on_step
        self.on_finished = on_finished
        # Called with (simulated seconds, requests finished) every PROGRESS_EVERY events: the
        # loop pays one comparison per event, nothing per step.
        self.on_progress = on_progress
        self._next_progress = PROGRESS_EVERY if on_progress is not None else sys.maxsize
        self.num_handed_over = 0  # finished requests passed to on_finished
        self.horizon = to_ticks(self.limits.max_sim_time_s) if self.limits.max_sim_time_s is not None else None
        # Delivered requests the policy has not been handed yet, and when each was delivered
        # (ticks: its arrival, or later where a router delays it).
        self.inbox: list[Request] = []
        self._inbox_ticks: list[int] = []
        # Sources that may still deliver requests (a trace, each released follow-up turn), or
        # free blocks the policy holds for them (a transfer under way).
        self.num_open_sources = 0
        self.end_reason = "done"
        self.num_events = 0
        self._wake: Event | None = None
        # The run under way, while its steps are taken (see `observe`).
        self._open_run: _OpenRun | None = None
        # Times a reader asked for the state (`observe`).
        self.num_observed = 0
        # The length of the last decode-only step of a run priced (ticks; 0: none yet, the
        # planned step's stands in): the next run's are likely alike (the batch changes by a
        # request or so between runs), so it sizes their lookahead (a prompt's chunks, longer,
        # are few: their repeat is priced whole).
        self._run_step_ticks = 0
        # Steps the next run's first lookahead prices at least (`_take_steps`).
        self._first_lookahead = 1
        self._num_rejected_seen = 0
        self._wall_start = time.perf_counter()
        self.process = env.process(self._serve())

    # ---- what sources call ------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """A request is delivered (now: at its arrival, when released, or after a router's delay)."""
        if request.status is Status.TIMED_OUT:  # its client gave up during the router's delay
            self.policy.timed_out.append(request)
            return
        self.inbox.append(request)
        self._inbox_ticks.append(self.env.now)
        self.wake()
        self._cut_for_deliveries()

    def open_source(self) -> None:
        self.num_open_sources += 1

    def close_source(self) -> None:
        self.num_open_sources -= 1
        self.wake()

    def cancel(self, request: Request) -> bool:
        """Its client gave up on `request` now: if it is here, delivered and not yet finished
        or rejected, it leaves (`Policy.cancel`). Returns whether it was here. The state is
        brought to now first (`observe`), so a run of steps is cut where it would change."""
        for index, delivered in enumerate(self.inbox):
            if delivered is request:
                del self.inbox[index], self._inbox_ticks[index]
                open_run = self._open_run
                if open_run is not None and index < open_run.seen:
                    open_run.seen -= 1
                request.status = Status.TIMED_OUT
                request.finish_s = self.now_s
                self.policy.timed_out.append(request)
                return True
        if self.policy.by_id.get(request.request_id) is not request:
            return False
        self.observe()
        if request.status in _HELD:  # (not finished in the step under way)
            self.policy.cancel(request, self.now_s)
            self.wake()  # its blocks are free
        return True

    def wake(self) -> None:
        """Something outside changed what the policy can do (a source closed; blocks it held
        for a transfer are free): an engine waiting for work plans again now."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    @property
    def now_s(self) -> float:
        return to_seconds(self.env.now)

    def observe(self) -> None:
        """Bring the policy's state to now, for a reader outside the engine (a router): as
        stepping leaves it, every step that has started completed (a step is completed when it
        starts). A run under way is cut at the step in progress and completed now; the engine
        goes on from there when that step ends, as after any cut."""
        self.num_observed += 1
        open_run = self._open_run
        if open_run is None or open_run.finished is not None:
            return
        ends = open_run.ends
        del ends[_num_started(open_run.end, ends, self.env.now):]
        open_run.limit = len(ends)
        open_run.finished = self._apply_run(open_run.run, open_run.end, ends) if ends else []
        self._wake_sooner(open_run)

    def num_outstanding(self) -> int:
        """Requests delivered here that have not left, as stepping shows them now: queued,
        running, swapped out, or delivered and not yet handed to the policy. A run under way is
        read, not cut: in it nothing joins the batch and nothing is preempted, so only the
        requests that finish in its steps started by now have left."""
        policy = self.policy
        count = len(self.inbox) + len(policy.waiting) + len(policy.running) + len(policy.swapped)
        open_run = self._open_run
        if open_run is not None and open_run.finished is None:
            count -= open_run.run.num_leaving(_num_started(open_run.end, open_run.ends, self.env.now))
        return count

    def _cut_for_deliveries(self) -> None:
        """Requests were delivered now, while a run's steps are taken: the steps that started
        before now stay; the next sees them, and the run goes on past it only as far as they
        leave it as planned (`Run.steps_kept`)."""
        open_run = self._open_run
        if open_run is None or open_run.finished is not None:
            return
        ends = open_run.ends
        started = _num_started(open_run.end, ends, self.env.now)
        for request in self.inbox[open_run.seen:]:
            open_run.limit = min(open_run.limit,
                                 started if open_run.closed_loop else open_run.run.steps_kept(request, started))
        open_run.seen = len(self.inbox)
        if open_run.limit < len(ends):
            del ends[open_run.limit:]
            self._wake_sooner(open_run)

    def _wake_sooner(self, open_run: _OpenRun) -> None:
        """The run's steps taken end sooner than the engine sleeps for: wake it now, to sleep
        again until then (SimPy's interrupt; not while it is already waking)."""
        if open_run.sleeping and self.env.active_process is not self.process:
            open_run.sleeping = False
            self.process.interrupt()

    # ---- the process ------------------------------------------------------------------------

    def _serve(self) -> Iterator[Event]:
        while True:
            if self.env.peek() == self.env.now:
                # What is still due now (a release a completion just started) goes first.
                yield _Late(self.env, 0)
            if self.horizon is not None and self.env.now >= self.horizon:
                self.end_reason = "max_sim_time"
                return
            self._take_inbox()
            plan = self.policy.schedule(self.now_s)
            if plan is None:
                if not self.num_open_sources and not self.inbox:
                    if self.policy.has_work():
                        raise ServesimError(_stuck_message(self.policy, self.now_s))
                    return
                self._wake = self.env.event()
                yield self._wake
                self._wake = None
                continue
            finished = yield from self._take_steps(plan)
            if finished is None:  # the horizon comes first
                return
            self._release(finished)
            self._flush()
            self.num_events += 1
            if self.num_events >= self._next_progress:
                self._next_progress += PROGRESS_EVERY
                self.on_progress(self.now_s, self.num_handed_over + len(self.policy.finished))
            if self.limits.check_invariants:
                self.policy.check()
            if self.limits.max_wall_time_s is not None and \
                    time.perf_counter() - self._wall_start > self.limits.max_wall_time_s:
                self.end_reason = "max_wall_time"
                return

    def _take_steps(self, plan: StepPlan) -> Iterator[Event]:
        """Run `plan`'s step and, where an accelerator extends it, the steps certain to follow,
        as far as they stay certain; returns the requests that finished (None: the horizon
        comes before the planned step ends)."""
        env, start = self.env, self.env.now
        duration = self._ticks(self.cost_model.step_time(plan), plan.step_id)
        end = start + duration
        if self.horizon is not None and end >= self.horizon:
            self.end_reason = "max_sim_time"
            return None
        # What the step does is known now, and nothing reads the policy before it ends (a
        # delivery only fills the inbox): it is completed here, at its end time, and recorded
        # as stepping records it; an accelerator extends it from the state it leaves.
        finished = self.policy.complete(plan, to_seconds(end))
        self.log.add(self._record(plan, start, duration), self._extras(plan))
        closed_loop = self.releases is not None
        run = None
        # (A finish releases requests when its step ends: not after a run.)
        if self.accelerator is not None and not (closed_loop and finished):
            num_observed = self.num_observed
            if env.peek() < end:
                # An event is due before the step ends: the run is asked for once it has
                # ended (what it delivered, in the inbox, then cuts it: `_cut_for_deliveries`),
                # unless a reader observed the state meanwhile (it may have changed it: a
                # cancel), which cuts a run before its first step.
                yield _Late(env, duration)
            if self.num_observed == num_observed and not (closed_loop and self.inbox):
                # (In a closed loop every delivery cuts a run.)
                run = self.accelerator.extend(plan, finished, closed_loop=closed_loop)
        if run is None:
            if env.now < end:
                yield _Late(env, end - env.now)
            if self.on_step is not None:
                self.on_step(to_seconds(end))
            return finished
        # The run's steps, priced a lookahead at a time: the engine sleeps to the end of those it
        # has taken. A delivery meanwhile (`_cut_for_deliveries`), or a reader's `observe`,
        # cuts them where the run stops being certain and wakes it to sleep until then.
        repeats = run.repeats()
        horizon = self.horizon if self.horizon is not None else math.inf
        open_run = self._open_run = _OpenRun(run, end, run.num_steps, 0, closed_loop)
        ends = open_run.ends
        self._cut_for_deliveries()  # (those of the planned step, if any, cut it first)
        rest: Repeat | None = None  # what is left of the repeat being priced
        # Steps a lookahead prices at least: more after each wake-up that did not cut the run.
        at_least, num_uncut = self._first_lookahead, 0
        while True:
            # Lookaheads of steps, within the run's limit and before the horizon, until the steps
            # taken reach the next event due: none while it may cut the run before they end.
            while len(ends) < open_run.limit and (open_run.taken_until < env.peek() or env.now >= open_run.taken_until):
                if rest is None:
                    rest = next(repeats)
                start = open_run.taken_until
                num_steps = _lookahead(env.peek() - start, self._run_step_ticks or duration, at_least,
                                       open_run.limit - len(ends))
                head, rest = _split(rest, num_steps)
                priced = self._price(head, start, plan.step_id + 1 + len(ends))
                if not head.plan.num_prefill_tokens:
                    self._run_step_ticks = priced[-1] - (priced[-2] if len(priced) > 1 else start)
                take = bisect_left(priced, horizon)
                if take < len(priced):
                    open_run.limit = len(ends) + take
                ends += priced[:take]
            if env.now >= open_run.taken_until and len(ends) >= open_run.limit:
                break
            open_run.sleeping = True
            try:
                yield _Late(env, open_run.taken_until - env.now)
            except simpy.Interrupt:
                continue  # cut (`_cut_for_deliveries`, `observe`): sleep until its new end
            finally:
                open_run.sleeping = False
            if len(ends) < open_run.limit:  # it goes on: what came before did not cut it
                num_uncut += 1
                at_least = max(2 * at_least, MIN_LOOKAHEAD_UNCUT)
            if self.limits.max_wall_time_s is not None and \
                    time.perf_counter() - self._wall_start > self.limits.max_wall_time_s:
                open_run.limit = len(ends)
        self._open_run = None
        # Where events did not cut this run (another replica's steps), the next prices as many
        # steps at first as after one of them; where they did, as many as reach the next.
        self._first_lookahead = MIN_LOOKAHEAD_UNCUT if num_uncut else 1
        if open_run.finished is not None:  # completed already, for a reader (`observe`)
            return [*finished, *open_run.finished]
        if not ends:
            return finished
        return [*finished, *self._apply_run(run, end, ends)]

    def _apply_run(self, run: Run, end: int, ends: list[int]) -> list[Request]:
        """Complete the first len(ends) steps of a run that starts at `end`, and record them.
        Requests delivered while they ran join the queue first, in order: each only joins
        (`Run.steps_kept`), and each step's record counts out those that arrived after it started."""
        starts = [end, *ends[:-1]]
        # (Delivered in order: those before the last step started lead the inbox.)
        num_late = bisect_right(self._inbox_ticks, starts[-1])
        joined = []
        if num_late:
            late, late_ticks = self.inbox[:num_late], self._inbox_ticks[:num_late]
            del self.inbox[:num_late], self._inbox_ticks[:num_late]
            joined = self._hand_over(late, late_ticks)
        # In seconds, the steps' ends, starts and durations.
        seconds = [to_seconds(tick) for tick in (end, *ends)]
        # (What routers read of a run under way, `num_outstanding`: checked against what it does.)
        num_leaving = run.num_leaving(len(ends)) if self.limits.check_invariants else None
        finished, columns = run.apply(seconds[1:])
        if num_leaving is not None and num_leaving != len(finished):
            raise AssertionError(f"a run said {num_leaving} requests leave in its first {len(ends)} steps; "
                                 f"{len(finished)} did")
        queue = len(self.policy.waiting)
        self.log.add_run(len(ends), columns._replace(
            start_s=seconds[:-1], duration_s=[to_seconds(b - a) for a, b in zip(starts, ends)],
            num_waiting=[queue - _count_after(joined, at) for at in starts] if joined else queue,
        ))
        return finished

    # ---- helpers ----------------------------------------------------------------------------

    def _take_inbox(self) -> None:
        """Hand the policy every request delivered so far, in order."""
        if self.inbox:
            requests, ticks = self.inbox, self._inbox_ticks
            self.inbox, self._inbox_ticks = [], []
            self._hand_over(requests, ticks)

    def _hand_over(self, requests: list[Request], ticks: list[int]) -> list[int]:
        """policy.add for each (delivered at `ticks`); returns the delivery ticks of those that
        joined the queue."""
        joined = []
        for request, tick in zip(requests, ticks):
            # At its arrival time as given, unless delivered later (a router's delay).
            self.policy.add(request, request.arrival_s if tick == to_ticks(request.arrival_s) else to_seconds(tick))
            if request.status is not Status.REJECTED:
                joined.append(tick)
        self._release(())
        return joined

    def _release(self, finished: list[Request] | tuple) -> None:
        """Requests that finished now, and those rejected since the last call (on arrival, or a
        victim that could never come back), are released: follow-up turns start their think
        time, a closed-loop client sends its next request."""
        releases = self.releases
        if releases is None:
            return
        at = self.now_s
        for request in finished:
            releases.release(request, at)
        rejected = self.policy.rejected
        while self._num_rejected_seen < len(rejected):
            request = rejected[self._num_rejected_seen]
            self._num_rejected_seen += 1
            releases.release(request, request.finish_s)

    def _record(self, plan: StepPlan, start: int, duration: int) -> StepRecord:
        """A planned step's row, with the state after it."""
        policy, bm = self.policy, self.policy.bm
        host = policy.host
        return StepRecord(
            plan.step_id, to_seconds(start), to_seconds(duration), plan.num_seqs, plan.num_prefill_tokens,
            plan.num_decode_tokens, plan.num_selecting, len(policy.running), len(policy.waiting),
            len(policy.swapped), bm.num_used_blocks, bm.num_shared_blocks,
            host.num_used_blocks if host is not None else 0, policy.num_resident_tokens, len(plan.preempted_ids),
            len(plan.blocks_to_swap_out), len(plan.blocks_to_swap_in), len(plan.blocks_to_copy),
        )

    def _extras(self, plan: StepPlan) -> dict[str, float] | None:
        """Columns a cost model adds to a step's record: its own measurements, and link time."""
        moves = plan.blocks_to_swap_in or plan.blocks_to_swap_out
        if not moves and getattr(self.cost_model, "last_step_extras", None) is None:
            return None
        extras = step_extras(self.cost_model)
        transfer_time = getattr(self.cost_model, "transfer_time", None)
        if transfer_time is not None and moves:
            extras["transfer_s"] = transfer_time(plan)
        return extras

    @staticmethod
    def _ticks(seconds: float, step_id: int) -> int:
        try:
            return duration_ticks(seconds)
        except InvalidDuration as exc:
            raise ServesimError(f"cost model returned {exc} for step {step_id}") from None

    def _price(self, repeat: Repeat, start: int, first_step_id: int) -> list[int]:
        """The end (ticks) of each step of a run's repeat that starts at `start`."""
        try:
            ticks = durations_ticks(repeat_times(self.cost_model, repeat))
        except InvalidDuration as exc:
            raise ServesimError(f"cost model returned {exc} for step {first_step_id + exc.index}") from None
        return list(accumulate(ticks, initial=start))[1:]

    def result(self, sim_time_s: float, wall_start: float, late: Sequence[Request] = ()) -> RunResult:
        """The engine's result once the clock stopped. A run that did not finish (a time limit)
        reports what is still queued, running or delivered as unfinished, with `late`: requests
        that never reached the engine."""
        policy = self.policy
        unfinished: list[Request] = []
        if self.end_reason != "done":
            unfinished = policy.drain_unfinished()
            for request in sorted([*self.inbox, *late], key=lambda r: (r.arrival_s, r.request_id)):
                request.status = Status.UNFINISHED
                unfinished.append(request)
        self._flush(final=True)
        self.log.close()
        if self.limits.check_invariants and self.end_reason == "done":
            policy.check_drained()
        return RunResult(
            finished=list(policy.finished), rejected=list(policy.rejected), unfinished=unfinished, steps=self.log,
            end_reason=self.end_reason, sim_time_s=sim_time_s, wall_time_s=time.perf_counter() - wall_start,
            num_events=self.num_events, itl=policy.itl, timed_out=list(policy.timed_out),
        )

    def _flush(self, final: bool = False) -> None:
        finished = self.policy.finished
        if self.on_finished is not None and (final or len(finished) >= FLUSH_EVERY):
            batch = list(finished)
            finished.clear()
            self.num_handed_over += len(batch)
            self.on_finished(batch)


def _split(repeat: Repeat, num_steps: int) -> tuple[Repeat, Repeat | None]:
    """A repeat's first `num_steps` steps, and the rest (None: none left)."""
    if num_steps >= repeat.num_steps:
        return repeat, None
    return (repeat._replace(num_steps=num_steps),
            repeat._replace(num_steps=repeat.num_steps - num_steps, advance=repeat.advance + num_steps))


def _lookahead(until_next: float, step_ticks: int, at_least: int, num_left: int) -> int:
    """Steps of a run to price next: as many as reach the next event due (`until_next` ticks
    away, infinite where none is), at `step_ticks` a step (a run's steps change slowly: the same
    batch, a position longer), so that where the event cuts the run the steps taken end soon
    after it and the pricing of few is wasted; but at least `at_least` (events that do not cut
    the run must not make a long one wake often: MIN_LOOKAHEAD_UNCUT); at most `num_left` and
    MAX_LOOKAHEAD."""
    reach = math.inf if until_next == math.inf else -(-int(until_next) // step_ticks)
    return int(min(num_left, MAX_LOOKAHEAD, max(at_least, reach)))


def _num_started(end: int, ends: list[int], now: int) -> int:
    """How many of a run's steps (starting at `end`, ending at `ends`) started before `now`."""
    return min(bisect_left(ends, now) + 1, len(ends)) if end < now else 0


def _count_after(arrivals: list[int], at: int) -> int:
    """How many of `arrivals` (ticks, in order) come after `at`."""
    count = 0
    for arrival in reversed(arrivals):
        if arrival <= at:
            break
        count += 1
    return count


@contextmanager
def _collector_for_a_run() -> Iterator[None]:
    """The garbage collector's settings while a run sets up, runs and reports. The templates
    live for the whole run: they are frozen first, before the run sorts them, so that no pass
    rescans them (the workload builders make them with the collector off, so the first pass
    after would find them all young). And the loop makes few reference cycles
    (tests/test_engine_cycles.py checks), so the collector's young passes, every 700 new
    containers by default, would find nothing to free while each rescans the step records and
    requests made since the last. Rarer passes still bound what a cycle could hold. (The 100k
    reference run, continuous batching, in one process: 10.6 s against 11.2 s with the
    collector's defaults; at 10k, 1%.)"""
    thresholds = gc.get_threshold()
    gc.freeze()
    if thresholds[0]:  # 0: the caller turned automatic collection off; leave it so
        gc.set_threshold(max(thresholds[0], GC_YOUNG_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _stuck_message(policy: Policy, now: float) -> str:
    head = policy.waiting[0] if policy.waiting else None
    detail = ""
    if head is not None:
        bm = policy.bm  # type: ignore[attr-defined]
        detail = (
            f"; the first waiting request {head.request_id} needs {head.num_tokens} positions "
            f"({bm.blocks_for(head.num_tokens)} blocks) and {bm.num_free_blocks} "
            f"of {bm.num_blocks} blocks are free"
        )
    return (
        f"the run cannot finish: at t={now:.3f}s no step can be scheduled and no request will "
        f"arrive ({len(policy.waiting)} waiting, {len(policy.running)} running, "
        f"{len(policy.swapped)} swapped){detail}"
    )
