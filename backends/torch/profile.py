"""Profiling the real engine: time a designed grid of step shapes, write a table for `profiled`.

The grid covers what the profiled model's terms need to be identifiable: prefills over chunk
length x context (GEMM curve and prefill attention), decode batches over batch x context (KV
reads), heterogeneous decode contexts, and mixed steps (a chunk plus decodes) to check that
the parts add up. Each shape runs once untimed, then `reps` times, in rounds that run every shape
once in a shuffled order (so a shape is timed after others, as in a real run); the median is
recorded.
Decode rows need a selected token they never prefilled: the engine is told it exists.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from backends.base import CostContext
from backends.profiled import plan_shape, step_kind, write_profile
from backends.torch.cost_model import TorchCostModel
from simcore.model import ModelSpec
from simcore.plan import ScheduledSeq, StepPlan


@dataclass(frozen=True)
class StepShape:
    kind: str
    prefill: tuple[tuple[int, int], ...] = ()  # (new tokens, context) per prefill piece
    decodes: tuple[int, ...] = ()  # context of each decode row

    def kv_positions(self) -> int:
        return sum(q + c for q, c in self.prefill) + sum(c + 1 for c in self.decodes)

    def num_blocks(self, block_size: int) -> int:
        ends = [q + c for q, c in self.prefill] + [c + 1 for c in self.decodes]
        return sum(-(-e // block_size) for e in ends)


def _powers(lo: int, hi: int, factor: int) -> list[int]:
    out, x = [], lo
    while x <= hi:
        out.append(x)
        x *= factor
    return out


def design_grid(*, max_context: int, max_batch: int, quick: bool = False, max_kv_tokens: int | None = None) -> list[StepShape]:
    factor = 4 if quick else 2
    shapes: list[StepShape] = []
    contexts = [0] + [c for c in (512, 2048, 8192, 32768) if c < max_context][: 2 if quick else 4]
    if len(contexts) == 1:  # short maximum: still vary the context of prefills
        contexts.append(max_context // 2)
    for q in _powers(16, max_context, factor):
        for c in contexts:
            if q + c <= max_context:
                shapes.append(StepShape("prefill", prefill=((q, c),)))
    lo = min(128, max(8, max_context // 8))
    decode_contexts = sorted(set(_powers(lo, max_context - 1, 4 if quick else 2)) | {max_context - 1})
    batches = sorted(set(_powers(1, max_batch, factor)) | {max_batch})
    for b in batches:
        for c in decode_contexts:
            shapes.append(StepShape("decode", decodes=(c,) * b))
    # Uneven contexts: the KV-read term must hold for sums, not only for equal rows.
    for b in batches[1::2]:
        spread = tuple(int(max_context * (i + 1) / (b + 1)) for i in range(b))
        shapes.append(StepShape("decode", decodes=spread))
    # Long contexts in front of a chunk (late chunks of a long prompt under chunked prefill).
    for q in sorted({min(256, max_context // 4), min(1024, max_context // 2)})[: 1 if quick else 2]:
        shapes.append(StepShape("prefill", prefill=((q, max_context - q),)))
    # Several prompts in one step (continuous batching admits them together): each piece is its
    # own attention call per layer, a cost one-piece shapes cannot tell from the rest.
    for k in (2, 4, 8)[: 2 if quick else 3]:
        for q in sorted({min(64, max_context // 8), min(256, max_context // 4)}):
            shapes.append(StepShape("prefill", prefill=((q, 0),) * k))
    chunks = [q for q in (256, 1024, 4096) if q <= max_context // 2][: 1 if quick else 3] or [max_context // 4]
    for q in chunks:
        for c in (0, max_context // 2 - q):
            for b in sorted({max(1, max_batch // 8), max(1, max_batch // 2)}):
                shapes.append(StepShape("mixed", prefill=((q, max(c, 0)),), decodes=(max_context // 4,) * b))
    for k in (2, 4)[: 1 if quick else 2]:  # several chunks beside the decodes
        shapes.append(StepShape("mixed", prefill=((chunks[0], 0),) * k, decodes=(max_context // 4,) * max(1, max_batch // 8)))
    if max_kv_tokens is not None:
        shapes = [s for s in shapes if s.kv_positions() <= max_kv_tokens]
    return shapes


class ShapeRunner:
    """Builds plans for shapes on a fresh block range and fresh request ids, and times them."""

    def __init__(self, cost_model: TorchCostModel) -> None:
        self.cost_model = cost_model
        self.engine = cost_model.engine
        self.block_size = self.engine.pool.block_size
        self._next_id = 1

    def plan(self, shape: StepShape) -> StepPlan:
        seqs, block = [], 0
        for c in shape.decodes:
            rid = self._new_id()
            self.engine.set_outputs(rid, c, [1])  # output 0 sits at position c, never prefilled here
            n = -(-(c + 1) // self.block_size)
            seqs.append(ScheduledSeq(rid, 1, c, True, c, tuple(range(block, block + n))))
            block += n
        for q, c in shape.prefill:
            rid = self._new_id()
            n = -(-(q + c) // self.block_size)
            seqs.append(ScheduledSeq(rid, q, c, True, q + c, tuple(range(block, block + n))))
            block += n
        return StepPlan(self._next_id, tuple(seqs))

    def time(self, shape: StepShape, reps: int) -> tuple[float, float]:
        """Median (wall, device) time of `reps` back-to-back runs after one untimed run."""
        walls, gpus = [], []
        for rep in range(reps + 1):
            wall, gpu = self.run_once(shape)
            if rep:  # the first run of a shape pays one-time costs (allocator growth, autotuning)
                walls.append(wall)
                gpus.append(gpu)
        return statistics.median(walls), statistics.median(gpus)

    def run_once(self, shape: StepShape) -> tuple[float, float]:
        plan = self.plan(shape)
        wall = self.cost_model.step_time(plan)
        self.forget(plan)
        return wall, self.cost_model.last_step_extras.get("gpu_time_s", wall)

    def forget(self, plan: StepPlan) -> None:
        for seq in plan.seqs:
            self.engine.forget(seq.request_id)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id


def profile_rows(cost_model: TorchCostModel, shapes: list[StepShape], reps: int,
                 progress: Callable[[int, int, dict], None] | None = None, *, interleave: bool = True,
                 seed: int = 0, round_progress: Callable[[int, int], None] | None = None,
                 run_progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Median time of each shape over `reps` timed runs (after one untimed run).

    Interleaved (the default): every round runs each shape once, in a freshly shuffled order, so a
    shape is timed after other shapes, as in a real run, and slow drift (clocks, a busy host)
    spreads over all shapes instead of biasing a contiguous stretch of the grid.
    `run_progress(done, total)` hears of each run of a shape (warm-up included), for a progress bar.
    """
    runner = ShapeRunner(cost_model)
    probes = []
    for shape in shapes:
        probe = runner.plan(shape)
        probes.append(plan_shape(probe))
        runner.forget(probe)
    # Each shape's untimed first run: what a shape costs the first time the process meets it (plan
    # builds, allocator growth). A serving run meets most prompt shapes once, so a first run far
    # above the median is a cost the table's time_s does not hold.
    first: list[float] = [math.nan] * len(shapes)
    if interleave:
        walls: list[list[float]] = [[] for _ in shapes]
        gpus: list[list[float]] = [[] for _ in shapes]
        rng = random.Random(seed)
        order = list(range(len(shapes)))
        for rnd in range(reps + 1):
            rng.shuffle(order)
            for n, i in enumerate(order):
                wall, gpu = runner.run_once(shapes[i])
                if run_progress is not None:
                    run_progress(rnd * len(shapes) + n + 1, (reps + 1) * len(shapes))
                if rnd:  # round 0 pays one-time costs (allocator growth, autotuning)
                    walls[i].append(wall)
                    gpus[i].append(gpu)
                else:
                    first[i] = wall
            if round_progress is not None:
                round_progress(rnd, reps + 1)
        timed = [(statistics.median(w), statistics.median(g)) for w, g in zip(walls, gpus, strict=True)]
    else:
        timed = [runner.time(shape, reps) for shape in shapes]
    rows = []
    for i, (shape_row, (wall, gpu)) in enumerate(zip(probes, timed, strict=True)):
        row = {"kind": step_kind(shape_row), **shape_row, "time_s": wall, "gpu_time_s": gpu, "reps": reps}
        if not math.isnan(first[i]):
            row["first_time_s"] = first[i]
        rows.append(row)
        if progress is not None:
            progress(i, len(shapes), row)
    return rows


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {platform.machine()} ({torch.get_num_threads()} threads)"


def kv_token_budget(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> int:
    """Positions of KV the profiler may allocate: most of free GPU memory after weights, 1 GiB on CPU."""
    per_token = spec.kv_bytes_per_token(torch.finfo(dtype).bits // 8)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        weights = spec.num_params * (torch.finfo(dtype).bits // 8)
        budget = 0.75 * (free - weights) - 4 * 2**30  # activations of an 8k-token prefill and slack
        return max(int(budget // per_token), 0)
    return int(2**30 // per_token)


def run_profile(
    spec: ModelSpec, *, out: str | Path, device: str | None = None, dtype: str | None = None, block_size: int = 16,
    max_context: int = 8192, max_batch: int = 256, quick: bool = False, reps: int | None = None, seed: int = 0,
    params: dict | None = None, progress: Callable[[int, int, dict], None] | None = None,
    round_progress: Callable[[int, int], None] | None = None, run_progress: Callable[[int, int], None] | None = None,
) -> list[dict]:
    """Profile `spec` and write the table to `out`; returns the rows."""
    from backends.torch.factory import make_torch, resolve_device, resolve_dtype

    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    shapes = design_grid(max_context=max_context, max_batch=max_batch, quick=quick,
                         max_kv_tokens=kv_token_budget(spec, torch_device, torch_dtype))
    num_blocks = max(s.num_blocks(block_size) for s in shapes) + 1
    cost_params = {"device": str(torch_device), "dtype": str(torch_dtype).removeprefix("torch."), **(params or {})}
    ctx = CostContext(model=spec, hardware_name=torch_device.type, block_size=block_size, num_blocks=num_blocks, seed=seed)
    cost_model = make_torch(cost_params, ctx)
    rows = profile_rows(cost_model, shapes, reps or (3 if quick else 5), progress, seed=seed,
                        round_progress=round_progress, run_progress=run_progress)
    header = {
        "device": device_name(torch_device),
        "dtype": str(torch_dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "model": json.dumps(dataclasses.asdict(spec), sort_keys=True),
        "block_size": str(block_size),
        "attention": cost_model.engine.decode_backend.name,
        "cuda_graphs": str(cost_model.engine.graphs is not None).lower(),
    }
    write_profile(out, header, rows)
    return rows
