"""Running sweep points: one worker function, and executors that yield its outputs as they finish.

The worker writes a point's results folder into a private temporary folder and returns the
files as bytes; only the driver writes into the sweep folder. So a killed driver leaves no
orphaned worker half-writing a point, a Ray worker needs no shared filesystem, and the bytes do
not depend on which worker ran the point or in which order. Workers on this machine make their
temporary folders in the output folder's scratch folder (`scratch`), which the next run into
that folder clears (experiments.io.locked_folder), so a killed sweep leaves nothing in /tmp.
"""

from __future__ import annotations

import os
import signal
import tempfile
import traceback
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments.sweep_store import PointOutput
from simcore.errors import ServesimError

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class PointTask:
    point_id: str
    # The point's experiment mapping (plain data, so it pickles to any worker, Ray included).
    data: dict[str, Any]
    # The experiment file, for relative paths (traces, model configs) and error messages.
    source: str | None
    # Where the worker makes its temporary folder; None: the system's temporary folder.
    scratch: str | None = None


def compute_point(task: PointTask) -> PointOutput:
    """Simulate one point; every failure becomes an error message, never an exception."""
    from experiments.config import parse_experiment
    from experiments.runner import run_experiment

    try:
        exp = parse_experiment(task.data, source=task.source)
        if task.scratch is not None:
            Path(task.scratch).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="servesim-point-", dir=task.scratch) as tmp:
            run = run_experiment(exp, source=task.source, out_dir=Path(tmp))
            files = {p.relative_to(tmp).as_posix(): p.read_bytes()
                     for p in sorted(Path(tmp).rglob("*")) if p.is_file()}
        return PointOutput(task.point_id, files, [r.summary for r in run.runs])
    except ServesimError as exc:
        return PointOutput(task.point_id, {}, [], error=str(exc))
    except Exception:  # noqa: BLE001 - one broken point must not stop the sweep; keep the traceback
        return PointOutput(task.point_id, {}, [], error=traceback.format_exc())


class Executor:
    """Runs point tasks, yielding outputs as they finish. Use as a context manager: worker processes
    (or the Ray connection) are started once and reused across calls, e.g. across bisection rounds."""

    # Scratch folder handed to tasks that name none (see PointTask.scratch); set by make_executor.
    scratch: str | None = None

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        # On an exception (Ctrl-C) do not wait for running points: they are redone on resume.
        self.close(abort=exc_type is not None)

    def run(self, tasks: list[PointTask]) -> Iterator[PointOutput]:
        raise NotImplementedError

    def close(self, *, abort: bool = False) -> None:
        pass

    def _placed(self, task: PointTask) -> PointTask:
        return task if task.scratch is not None or self.scratch is None else replace(task, scratch=self.scratch)


class InlineExecutor(Executor):
    """In this process, in task order (--jobs 1): simplest to debug, no start-up cost."""

    def run(self, tasks: list[PointTask]) -> Iterator[PointOutput]:
        return (compute_point(self._placed(t)) for t in tasks)


def _ignore_sigint() -> None:
    # Ctrl-C is the driver's to handle (it stops the pool); workers dying mid-print would only add noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ProcessExecutor(Executor):
    """A concurrent.futures process pool of `jobs` workers."""

    def __init__(self, jobs: int) -> None:
        import multiprocessing

        # spawn, not fork: the driver may hold threads (tqdm's monitor) that fork would copy mid-state.
        self.pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_ignore_sigint)

    def run(self, tasks: list[PointTask]) -> Iterator[PointOutput]:
        futures = {self.pool.submit(compute_point, self._placed(t)): t for t in tasks}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                # Same-moment completions in a stable order, for reproducible progress output.
                for future in sorted(done, key=lambda f: futures[f].point_id):
                    yield _output(future, futures[future])
        finally:
            if pending:
                self._stop()

    def close(self, *, abort: bool = False) -> None:
        if abort:
            self._stop()
        else:
            self.pool.shutdown(wait=True)

    def _stop(self) -> None:
        """Cancel queued points and end running ones now (interrupted sweep): they are redone on resume."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        terminate = getattr(self.pool, "terminate_workers", None)  # Python >= 3.14
        if terminate is not None:
            terminate()
            return
        for process in list((getattr(self.pool, "_processes", None) or {}).values()):
            process.terminate()


def _output(future: Future, task: PointTask) -> PointOutput:
    error = future.exception()
    if error is None:
        return future.result()
    # The worker process itself died (out of memory, killed): the point fails, the sweep goes on.
    return PointOutput(task.point_id, {}, [], error=f"worker process failed: {error!r}")


class RayExecutor(Executor):
    """Points as Ray tasks, on a running cluster (`address`) or a private local instance."""

    def __init__(self, jobs: int, address: str | None) -> None:
        try:
            import ray
        except ImportError:
            raise ServesimError("--executor ray needs the `ray` package: pip install -e '.[ray]' in the servesim repository") from None
        self.ray = ray
        self.started_here = not ray.is_initialized()
        if self.started_here:
            if address:
                ray.init(**_ray_init_args(jobs, address))
            else:
                with _loopback_only():
                    ray.init(**_ray_init_args(jobs, address))
        self.remote = ray.remote(num_cpus=1)(compute_point)

    def run(self, tasks: list[PointTask]) -> Iterator[PointOutput]:
        pending = [self.remote.remote(self._placed(t)) for t in tasks]
        try:
            while pending:
                ready, pending = self.ray.wait(pending, num_returns=1)
                yield self.ray.get(ready[0])
        finally:
            for ref in pending:
                self.ray.cancel(ref, force=True)

    def close(self, *, abort: bool = False) -> None:
        if self.started_here:
            self.ray.shutdown()


def make_executor(executor: str = "local", *, jobs: int = 1, address: str | None = None,
                  scratch: Path | None = None) -> Executor:
    """`scratch`: a folder for the workers' temporary folders, used by workers on this machine
    (local processes, a private Ray); workers of a Ray cluster (`address`) use their own /tmp."""
    if executor == "ray":
        pool: Executor = RayExecutor(jobs, address)
        # Only a Ray instance started here is sure to run its workers on this machine.
        local_workers = pool.started_here and not address
    elif executor == "local":
        pool = InlineExecutor() if jobs <= 1 else ProcessExecutor(jobs)
        local_workers = True
    else:
        raise ServesimError(f"unknown executor {executor!r}; expected one of {list(EXECUTORS)}")
    if scratch is not None and local_workers:
        pool.scratch = str(Path(scratch).resolve())
    return pool


@contextmanager
def _loopback_only() -> Iterator[None]:
    """A private Ray instance that listens on 127.0.0.1 only, not on every interface.

    On Linux Ray gives a new node its outward address and its servers (GCS, raylet, workers)
    listen on all interfaces; `_node_ip_address="127.0.0.1"` does not help, as ray.init turns a
    loopback address into the outward one. Ray keeps a node on loopback where clusters are off
    (its default on macOS and Windows), so that switch is turned off for the start of this
    instance only: a later ray.init(address=...) in this process joins a cluster as usual. The
    setting is read when the node starts; tests/test_sweep_ray.py checks the listening sockets."""
    try:
        from ray._private import ray_constants
    except ImportError:
        ray_constants = None
    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):  # a Ray without the switch: start as it would
        yield
        return
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def _ray_init_args(jobs: int, address: str | None) -> dict[str, Any]:
    if address:
        # A running cluster: its workers must have servesim installed (pip install -e . in each worker's copy of the repository).
        return {"address": address, "log_to_driver": False}
    # A private local instance: workers import servesim from this checkout, wherever they start.
    root = str(Path(__file__).resolve().parent.parent)
    python_path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {
        "num_cpus": max(1, jobs), "include_dashboard": False, "log_to_driver": False,
        "_node_ip_address": "127.0.0.1",  # with _loopback_only, which makes Ray keep it
        "runtime_env": {"env_vars": {"PYTHONPATH": python_path}},
    }
