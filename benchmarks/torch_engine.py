"""Speed benchmark of the real torch engine: against the HBM roofline, and against transformers.

Roofline cases (the default): decode batch 1 at context 512, batch 64 and 256 at context 2048,
one 8192-token prefill, and a burst of 256 requests (prompts 64-1024 tokens, 128 outputs each)
through a small continuous-batching loop with its own block allocator (self-contained on
purpose: it exercises the engine, not the simulator's policies). Each step's HBM roofline is the
bytes it must read, weights once plus the KV of every context position, over 4.8 TB/s (H200);
`x_roofline` is the measured time over that bound (1.0 would be perfect). The burst is also set
against its own bound (`burst_bound`): every prompt's FLOPs at peak plus, for each decode step
with every request running, the weights and all KV read at HBM bandwidth.

`--vs-transformers`: one random Llama checkpoint, written by transformers (save_pretrained) and
read by our engine through its safetensors loader, generates the same greedy tokens in both, in
one process, interleaved, best of `--repeats`: prefill (one forward over the batch's prompts; for
transformers a plain forward keeping the last logits), decode (the median step; transformers'
steps timed by generate's streamer) and end to end (`generate` against our prefill step plus
decode steps). Ratios are transformers' time over ours (above 1: we are faster).

    python benchmarks/torch_engine.py --device cuda --model llama-3.1-8b --out bench.json
    python benchmarks/torch_engine.py --tiny          # CPU-sized, about a minute
    python benchmarks/torch_engine.py --vs-transformers --out vs.json   # hidden 1024, 8 layers, batch 1/8/32
    python benchmarks/torch_engine.py --vs-transformers --tiny          # seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
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
    bound = burst_bound(spec, dtype_bytes, [r.prompt_len for r in waiting], sizes.burst_outputs)
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
        "bound_s": bound, "bound_output_tokens_per_s": outputs / bound, "x_bound": total / bound,
    }


def burst_bound(spec, dtype_bytes: int, prompts: list[int], outputs: int) -> float:
    """Seconds a burst cannot beat: every prompt's FLOPs at peak, then outputs - 1 decode steps
    with every request running, each reading the weights once and every request's KV."""
    prefill = sum(step_flops(spec, p, p * (p + 1) // 2) for p in prompts) / PEAK_FLOPS
    # Decode step k (1 .. outputs-1) processes position p + k - 1 of each request: p + k positions of KV.
    decode = sum(step_bytes(spec, dtype_bytes, sum(prompts) + k * len(prompts)) for k in range(1, outputs))
    return prefill + decode / HBM_BYTES_PER_S


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


# --- side by side with transformers -------------------------------------------------------------


@dataclass(frozen=True)
class CompareShape:
    hidden: int
    layers: int
    q_heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    prompt: int  # tokens per prompt
    outputs: int  # tokens generated per request
    batches: tuple[int, ...]


# The shape issue 41 quotes for a 2-core CPU; intermediate and vocabulary Llama-like.
COMPARE_CPU = CompareShape(1024, 8, 16, 4, 2816, 32000, 256, 64, (1, 8, 32))
COMPARE_TINY = CompareShape(64, 2, 4, 2, 128, 256, 24, 6, (1, 4))


def random_checkpoint(shape: CompareShape, folder: Path, seed: int = 0):
    """A random LlamaForCausalLM of `shape` saved with save_pretrained; returns it (eval, fp32)."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    config = transformers.LlamaConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.q_heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=max(4096, shape.prompt + shape.outputs), rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.save_pretrained(folder)
    hf.generation_config.eos_token_id = None  # every request generates exactly `outputs` tokens
    return hf


def _clock_streamer():
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        """generate() hands it the prompt, then each step's tokens: a timestamp per step."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value) -> None:  # noqa: ANN001
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    return Clock()


def time_transformers(hf, prompts, outputs: int, cache: str, sync) -> dict:  # noqa: ANN001
    """generate() end to end and per decode step, and a plain prefill forward (last logits only)."""
    import torch

    ids = torch.tensor(prompts, device=hf.device)
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        sync()
        t0 = time.perf_counter()
        logits = hf(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1).logits
        logits[:, -1].argmax(-1).tolist()
        prefill = time.perf_counter() - t0
        del logits
        clock = _clock_streamer()
        sync()
        t0 = time.perf_counter()
        out = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=outputs, min_new_tokens=outputs,
                          streamer=clock, pad_token_id=0, cache_implementation=cache)
        sync()
        total = time.perf_counter() - t0
    # clock.times: the prompt, then one per selected token (the first right after the prefill).
    return {"prefill_s": prefill, **_decode_figures(clock.times[1:]), "end_to_end_s": total,
            "tokens": out[:, ids.shape[1]:].tolist()}


def _decode_figures(marks: list[float]) -> dict:
    """Per decode step from the times each step ended (the first: the prefill's end): the median
    (robust to a busy host's spells) and the mean."""
    steps = [b - a for a, b in zip(marks, marks[1:])]
    if not steps:
        return {"decode_step_s": float("nan"), "decode_step_mean_s": float("nan")}
    return {"decode_step_s": statistics.median(steps), "decode_step_mean_s": sum(steps) / len(steps)}


def time_engine(engine, prompts, outputs: int, first_id: int, sync) -> dict:  # noqa: ANN001
    """Our engine: one prefill step over every prompt, then outputs - 1 decode steps."""
    from simcore.plan import ScheduledSeq, StepPlan

    bs = engine.pool.block_size
    width = -(-(len(prompts[0]) + outputs) // bs)
    rids = [first_id + i for i in range(len(prompts))]
    tables = [tuple(range(i * width, (i + 1) * width)) for i in range(len(prompts))]
    ids = [tuple(p) for p in prompts]
    n = len(prompts[0])
    sync()
    t0 = time.perf_counter()
    engine.execute(StepPlan(0, tuple(ScheduledSeq(r, n, 0, True, n, t, p) for r, t, p in zip(rids, tables, ids, strict=True))))
    sync()
    marks = [time.perf_counter()]
    for k in range(1, outputs):  # decode k processes output k-1, at position n + k - 1
        engine.execute(StepPlan(k, tuple(ScheduledSeq(r, 1, n + k - 1, True, n, t, p)
                                         for r, t, p in zip(rids, tables, ids, strict=True))))
        sync()
        marks.append(time.perf_counter())
    t1, t2 = marks[0], marks[-1]
    tokens = [engine.output_token_ids(r) for r in rids]
    for r in rids:
        engine.forget(r)
    return {"prefill_s": t1 - t0, **_decode_figures(marks), "end_to_end_s": t2 - t0, "tokens": tokens}


METRICS = ("prefill_s", "decode_step_s", "end_to_end_s")  # the best of each is kept
EXTRA = ("decode_step_mean_s",)


def compare_transformers(shape: CompareShape, *, device: str | None, dtype: str | None, repeats: int,
                         cache: str = "dynamic", attention: str = "auto", folder: Path | None = None,
                         progress=print) -> dict:  # noqa: ANN001
    """Both engines on the same checkpoint and prompts, interleaved; best (least) of `repeats` each."""
    import tempfile

    import numpy as np
    import torch

    from backends.base import CostContext
    from backends.torch.factory import make_torch, resolve_device, resolve_dtype
    from simcore.hf_config import load_hf_config

    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    sync = (lambda: torch.cuda.synchronize(torch_device)) if torch_device.type == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory(prefix="servesim-vs-hf-") as tmp:
        where = folder or Path(tmp)
        hf = random_checkpoint(shape, where).to(device=torch_device, dtype=torch_dtype)
        spec = load_hf_config(where)
        block_size = 16
        width = -(-(shape.prompt + shape.outputs) // block_size)
        ctx = CostContext(model=spec, hardware_name=torch_device.type, block_size=block_size,
                          num_blocks=max(shape.batches) * width + 1)
        cost_model = make_torch({"device": str(torch_device), "dtype": str(torch_dtype).removeprefix("torch."),
                                 "weights": str(where), "attention": attention}, ctx)
    engine = cost_model.engine
    rng = np.random.default_rng(0)
    prompts = {b: rng.integers(0, shape.vocab, size=(b, shape.prompt)).tolist() for b in shape.batches}
    best: dict[tuple[int, str], dict] = {}
    matches: dict[int, float] = {}
    next_id = 1
    # An untimed round at the smallest batch: one-time costs (allocation, lazy init) of both.
    time_engine(engine, prompts[shape.batches[0]], shape.outputs, next_id, sync)
    time_transformers(hf, prompts[shape.batches[0]], shape.outputs, cache, sync)
    for rep in range(repeats):
        for b in shape.batches:
            order = ("ours", "transformers") if (rep + b) % 2 == 0 else ("transformers", "ours")
            for who in order:
                next_id += b
                got = (time_engine(engine, prompts[b], shape.outputs, next_id, sync) if who == "ours"
                       else time_transformers(hf, prompts[b], shape.outputs, cache, sync))
                tokens = got.pop("tokens")
                if who == "ours":
                    ours_tokens = tokens
                else:
                    hf_tokens = tokens
                keep = best.setdefault((b, who), dict(got))
                for m in METRICS + EXTRA:
                    keep[m] = min(keep[m], got[m])
            matches[b] = float(np.mean(np.array(ours_tokens) == np.array(hf_tokens)))
            progress(f"  repeat {rep + 1}/{repeats} batch {b}: ours " + fmt_times(best[(b, 'ours')])
                     + " | transformers " + fmt_times(best[(b, 'transformers')]))
    rows = []
    for b in shape.batches:
        ours, theirs = best[(b, "ours")], best[(b, "transformers")]
        rows.append({"batch": b, "prompt": shape.prompt, "outputs": shape.outputs, "ours": ours,
                     "transformers": theirs, "ratio": {m.removesuffix("_s"): theirs[m] / ours[m] for m in METRICS},
                     "tokens_equal": matches[b]})
    meta = {"shape": dataclasses.asdict(shape), "device": str(torch_device),
            "dtype": str(torch_dtype).removeprefix("torch."), "torch": torch.__version__,
            "transformers": __import__("transformers").__version__, "threads": torch.get_num_threads(),
            "repeats": repeats, "cache": cache, "attention": engine.decode_backend.name,
            "ratio": "transformers time / our time (above 1: ours is faster)"}
    return {"meta": meta, "results": rows}


def fmt_times(t: dict) -> str:
    return f"prefill {t['prefill_s'] * 1e3:.1f} ms, decode {t['decode_step_s'] * 1e3:.2f} ms/step, e2e {t['end_to_end_s']:.3f} s"


def print_comparison(figures: dict) -> None:
    meta = figures["meta"]
    s = meta["shape"]
    print(f"\nours vs transformers {meta['transformers']} ({meta['cache']} cache) on {meta['device']}, {meta['dtype']}, "
          f"{meta['threads']} threads: hidden {s['hidden']}, {s['layers']} layers, heads {s['q_heads']}/{s['kv_heads']}, "
          f"{s['prompt']}-token prompts, {s['outputs']} outputs; best of {meta['repeats']}; ratio = theirs / ours")
    head = (f"{'batch':>5s} {'prefill ms':>19s} {'decode ms/step':>19s} {'end to end s':>19s}  "
            f"{'x prefill':>9s} {'x decode':>9s} {'x e2e':>9s} {'same tok':>8s}")
    print(head + "\n" + "-" * len(head))
    for r in figures["results"]:
        o, t, x = r["ours"], r["transformers"], r["ratio"]
        print(f"{r['batch']:5d} {o['prefill_s'] * 1e3:9.1f}/{t['prefill_s'] * 1e3:9.1f} "
              f"{o['decode_step_s'] * 1e3:9.2f}/{t['decode_step_s'] * 1e3:9.2f} "
              f"{o['end_to_end_s']:9.3f}/{t['end_to_end_s']:9.3f}  "
              f"{x['prefill']:9.2f} {x['decode_step']:9.2f} {x['end_to_end']:9.2f} {r['tokens_equal']:8.0%}")
    print("(columns: ours/transformers)")


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
    g = p.add_argument_group("against transformers")
    g.add_argument("--vs-transformers", action="store_true",
                   help="time our engine and transformers side by side instead (hidden 1024, 8 layers; tiny with --tiny)")
    g.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,8,32; 1,4 with --tiny)")
    g.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 256)")
    g.add_argument("--outputs", type=int, default=None, help="tokens generated per request (default 64)")
    g.add_argument("--repeats", type=int, default=3, help="interleaved repeats; the best of each is kept")
    g.add_argument("--hf-cache", default="dynamic", choices=["dynamic", "static"],
                   help="transformers' KV cache in generate()")
    return p


def main_vs_transformers(args: argparse.Namespace) -> int:
    shape = COMPARE_TINY if args.tiny else COMPARE_CPU
    if args.batches:
        shape = dataclasses.replace(shape, batches=tuple(int(b) for b in args.batches.split(",")))
    if args.prompt:
        shape = dataclasses.replace(shape, prompt=args.prompt)
    if args.outputs:
        shape = dataclasses.replace(shape, outputs=args.outputs)
    figures = compare_transformers(shape, device=args.device or ("cpu" if args.tiny else None), dtype=args.dtype,
                                   repeats=args.repeats, cache=args.hf_cache, attention=args.attention)
    print_comparison(figures)
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    import torch

    from backends.base import CostContext
    from backends.torch.factory import make_torch, resolve_device, resolve_dtype
    from simcore.presets import get_model

    args = build_parser().parse_args(argv)
    if args.vs_transformers:
        return main_vs_transformers(args)
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
