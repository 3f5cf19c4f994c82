"""Speed benchmark of the real torch engine against the HBM roofline.

Cases: decode batch 1 at context 512, batch 64 and 256 at context 2048, one 8192-token prefill,
and a burst of 256 requests (prompts 64-1024 tokens, 128 outputs each) through a small
continuous-batching loop with its own block allocator (self-contained on purpose: it exercises
the engine, not the simulator's policies). Each step's HBM roofline is the bytes it must read,
weights once plus the KV of every context position, over 4.8 TB/s (H200); `x_roofline` is the
measured time over that bound (1.0 would be perfect).

    python benchmarks/torch_engine.py --device cuda --model llama-3.1-8b --out bench.json
    python benchmarks/torch_engine.py --tiny          # CPU-sized, about a minute
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

HBM_BYTES_PER_S = 4.8e12  # H200 datasheet
PEAK_FLOPS = 989e12  # H100/H200 bf16 dense


@dataclass(frozen=True)
class Sizes:
    decode_cases: tuple[tuple[int, int], ...]  # (batch, context)
    prefill_tokens: int
    burst_requests: int
    burst_prompt: tuple[int, int]
    burst_outputs: int
    max_batched_tokens: int
    max_seqs: int


FULL = Sizes(((1, 512), (64, 2048), (256, 2048)), 8192, 256, (64, 1024), 128, 8192, 256)
TINY = Sizes(((1, 128), (8, 256), (32, 256)), 512, 16, (16, 128), 16, 1024, 16)


def step_bytes(spec, dtype_bytes: int, kv_positions: int) -> float:
    return spec.num_params * dtype_bytes + kv_positions * spec.kv_bytes_per_token(dtype_bytes)


def step_flops(spec, tokens: int, attention_pairs: int) -> float:
    return 2.0 * spec.num_params * tokens + 4.0 * spec.num_q_heads * spec.head_dim * attention_pairs


def plan_roofline(spec, dtype_bytes: int, plan) -> tuple[float, float]:
    """(HBM-bound seconds, max(HBM, compute) seconds) of one plan."""
    kv = sum(s.end_len for s in plan.seqs)
    pairs = sum(s.num_new_tokens * s.context_len + s.num_new_tokens * (s.num_new_tokens + 1) // 2 for s in plan.seqs)
    hbm = step_bytes(spec, dtype_bytes, kv) / HBM_BYTES_PER_S
    return hbm, max(hbm, step_flops(spec, plan.num_batched_tokens, pairs) / PEAK_FLOPS)


class BlockAllocator:
    """A free list with reservations: admit a request only if its whole lifetime fits."""

    def __init__(self, num_blocks: int) -> None:
        self.free = deque(range(num_blocks))
        self.reserved = 0

    def can_reserve(self, n: int) -> bool:
        return len(self.free) - self.reserved >= n

    def reserve(self, n: int) -> None:
        self.reserved += n

    def take(self) -> int:
        self.reserved -= 1
        return self.free.popleft()

    def give_back(self, blocks: list[int], unused_reservation: int) -> None:
        self.free.extend(blocks)
        self.reserved -= unused_reservation


@dataclass
class BurstRequest:
    rid: int
    prompt_len: int
    outputs_wanted: int
    blocks: list[int] = field(default_factory=list)
    processed: int = 0
    outputs: int = 0

    def lifetime_blocks(self, bs: int) -> int:
        return -(-(self.prompt_len + self.outputs_wanted - 1) // bs)


def run_burst(cost_model, spec, sizes: Sizes, dtype_bytes: int, seed: int = 0) -> dict:
    import numpy as np

    from simcore.plan import ScheduledSeq, StepPlan

    bs = cost_model.engine.pool.block_size
    alloc = BlockAllocator(cost_model.engine.pool.num_blocks)
    rng = np.random.default_rng(seed)
    lo, hi = sizes.burst_prompt
    waiting = deque(BurstRequest(10_000_000 + i, int(rng.integers(lo, hi + 1)), sizes.burst_outputs)
                    for i in range(sizes.burst_requests))
    running: list[BurstRequest] = []
    step_times, rooflines, hbm_rooflines, steps = [], [], [], 0
    started = time.perf_counter()
    while waiting or running:
        seqs, budget = [], sizes.max_batched_tokens
        for r in running:  # decodes: process the last selected token
            if r.processed % bs == 0:
                r.blocks.append(alloc.take())
            seqs.append(ScheduledSeq(r.rid, 1, r.processed, True, r.prompt_len, tuple(r.blocks)))
            budget -= 1
        while (waiting and len(running) < sizes.max_seqs and waiting[0].prompt_len <= budget
               and alloc.can_reserve(waiting[0].lifetime_blocks(bs))):
            r = waiting.popleft()
            alloc.reserve(r.lifetime_blocks(bs))
            r.blocks = [alloc.take() for _ in range(-(-r.prompt_len // bs))]
            seqs.append(ScheduledSeq(r.rid, r.prompt_len, 0, True, r.prompt_len, tuple(r.blocks)))
            budget -= r.prompt_len
            running.append(r)
        if not seqs:
            raise RuntimeError("burst: nothing schedulable; the pool is too small for one request")
        plan = StepPlan(steps, tuple(seqs))
        step_times.append(cost_model.step_time(plan))
        hbm, roof = plan_roofline(spec, dtype_bytes, plan)
        hbm_rooflines.append(hbm)
        rooflines.append(roof)
        steps += 1
        for s in seqs:
            r = next(x for x in running if x.rid == s.request_id)
            r.processed = s.end_len
            r.outputs += 1
        for r in [x for x in running if x.outputs >= x.outputs_wanted]:
            running.remove(r)
            alloc.give_back(r.blocks, r.lifetime_blocks(bs) - len(r.blocks))
            cost_model.engine.forget(r.rid)
    total = sum(step_times)
    outputs = sizes.burst_requests * sizes.burst_outputs
    return {
        "case": f"burst {sizes.burst_requests} req, prompts {lo}-{hi}, {sizes.burst_outputs} outputs",
        "time_s": total, "wall_s": time.perf_counter() - started, "steps": steps,
        "output_tokens_per_s": outputs / total, "roofline_hbm_s": sum(hbm_rooflines), "roofline_s": sum(rooflines),
        "x_roofline": total / sum(hbm_rooflines),
    }


def run_cases(cost_model, spec, sizes: Sizes, dtype_bytes: int, reps: int) -> list[dict]:
    from backends.torch.profile import ShapeRunner, StepShape

    runner = ShapeRunner(cost_model)
    shapes = [(f"decode batch {b} ctx {c}", StepShape("decode", decodes=(c,) * b)) for b, c in sizes.decode_cases]
    shapes.append((f"prefill 1x{sizes.prefill_tokens}", StepShape("prefill", prefill=((sizes.prefill_tokens, 0),))))
    results = []
    for name, shape in shapes:
        plan = runner.plan(shape)
        hbm, roof = plan_roofline(spec, dtype_bytes, plan)
        runner.forget(plan)
        wall, gpu = runner.time(shape, reps)
        results.append({"case": name, "time_s": wall, "gpu_time_s": gpu, "roofline_hbm_s": hbm,
                        "roofline_s": roof, "x_roofline": wall / hbm})
    return results


def pool_blocks(sizes: Sizes, block_size: int) -> int:
    decode = max(b * -(-(c + 1) // block_size) for b, c in sizes.decode_cases)
    prefill = -(-sizes.prefill_tokens // block_size)
    per_request = -(-(sizes.burst_prompt[1] + sizes.burst_outputs) // block_size)
    return max(decode, prefill, min(sizes.burst_requests, sizes.max_seqs) * per_request) + 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--model", default=None, help="preset or config path (default llama-3.1-8b; tiny-llama with --tiny)")
    p.add_argument("--tiny", action="store_true", help="CPU-sized cases (about a minute)")
    p.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"])
    p.add_argument("--attention", default="auto", choices=["auto", "portable", "triton", "flex"])
    p.add_argument("--cuda-graphs", action="store_true")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--burst-requests", type=int, default=None, help="override the burst size")
    p.add_argument("--burst-outputs", type=int, default=None, help="override outputs per burst request")
    p.add_argument("--skip-burst", action="store_true")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    import dataclasses

    import torch

    from backends.base import CostContext
    from backends.torch.factory import make_torch, resolve_device, resolve_dtype
    from simcore.presets import get_model

    args = build_parser().parse_args(argv)
    sizes = TINY if args.tiny else FULL
    if args.burst_requests is not None:
        sizes = dataclasses.replace(sizes, burst_requests=args.burst_requests)
    if args.burst_outputs is not None:
        sizes = dataclasses.replace(sizes, burst_outputs=args.burst_outputs)
    spec = get_model(args.model or ("tiny-llama" if args.tiny else "llama-3.1-8b"))
    device = resolve_device(args.device or ("cpu" if args.tiny else None))
    dtype = resolve_dtype(args.dtype, device)
    dtype_bytes = torch.finfo(dtype).bits // 8
    ctx = CostContext(model=spec, hardware_name=device.type, block_size=args.block_size,
                      num_blocks=pool_blocks(sizes, args.block_size))
    cost_model = make_torch({"device": str(device), "dtype": str(dtype).removeprefix("torch."),
                             "attention": args.attention, "cuda_graphs": args.cuda_graphs}, ctx)
    results = run_cases(cost_model, spec, sizes, dtype_bytes, args.reps)
    if not args.skip_burst:
        results.append(run_burst(cost_model, spec, sizes, dtype_bytes))
    print(f"{spec.name} on {device} ({str(dtype).removeprefix('torch.')}, attention "
          f"{cost_model.engine.decode_backend.name}, cuda graphs {cost_model.engine.graphs is not None})")
    print(f"{'case':52s} {'time ms':>10s} {'roofline ms':>12s} {'x roofline':>11s}")
    for r in results:
        print(f"{r['case']:52s} {r['time_s'] * 1e3:10.3f} {r['roofline_hbm_s'] * 1e3:12.4f} {r['x_roofline']:11.1f}")
    if args.out:
        meta = {"model": spec.name, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
                "torch": torch.__version__, "attention": cost_model.engine.decode_backend.name,
                "cuda_graphs": cost_model.engine.graphs is not None, "hbm_bytes_per_s": HBM_BYTES_PER_S}
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
