"""`servesim profile`: time a grid of step shapes on the real torch engine and write a table.

The table feeds the `profiled` cost model. After writing it, the command prints that model's
cross-validated error (each quarter of the rows predicted by a fit on the rest), overall and by
step kind, and two extrapolations (mixed steps from pure ones, long contexts from short ones),
so a user sees how far to trust it; `servesim validate` checks it against the real engine.
"""

from __future__ import annotations

import argparse
import time

from simcore.errors import ServesimError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny-llama", help="preset name or path to a HF config.json / directory")
    parser.add_argument("--out", required=True, help="CSV file to write")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"],
                        help="default bf16 on cuda, fp32 on cpu")
    parser.add_argument("--weights", default=None, help="local HF checkpoint directory (default: random weights)")
    parser.add_argument("--attention", default="auto", choices=["auto", "portable", "triton", "flex"],
                        help="decode attention kernel: portable (gather + SDPA, runs anywhere), triton (paged "
                             "flash-decoding), flex (FlexAttention); auto = triton on CUDA when importable")
    parser.add_argument("--cuda-graphs", action="store_true", help="capture decode-only steps in CUDA graphs")
    parser.add_argument("--quick", action="store_true", help="a coarse grid with 3 repetitions")
    parser.add_argument("--max-context", type=int, default=None, help="longest context profiled (default 8192; 1024 on cpu)")
    parser.add_argument("--max-batch", type=int, default=None, help="largest decode batch (default 256; 32 on cpu)")
    parser.add_argument("--block-size", type=int, default=16, help="KV cache block size in tokens")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per shape (median kept)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights and the order shapes are timed in")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (1 gives steadier CPU timings on a shared machine)")
    parser.add_argument("--quiet", action="store_true", help="no progress (bar or round lines)")


def run(args: argparse.Namespace) -> int:
    try:
        import torch
    except ModuleNotFoundError:
        raise ServesimError("`servesim profile` needs PyTorch (pip install -e '.[torch]' in the servesim repository)") from None
    from backends.profiled import format_holdout, holdout_report, read_profile
    from backends.torch.profile import run_profile
    from experiments.progress import progress_bar, progress_wanted
    from simcore.presets import get_model

    spec = get_model(args.model)
    if args.threads:
        torch.set_num_threads(args.threads)
    on_cpu = args.device == "cpu" or (args.device is None and not torch.cuda.is_available())
    max_context = args.max_context or (1024 if on_cpu else 8192)
    max_batch = args.max_batch or (32 if on_cpu else 256)
    if max_context < 32 or max_batch < 1 or args.block_size < 1:
        raise ServesimError("--max-context must be >= 32, --max-batch and --block-size >= 1")
    params = {"attention": args.attention, "cuda_graphs": args.cuda_graphs}
    if args.weights:
        params["weights"] = args.weights
    started = time.perf_counter()

    def progress(i: int, n: int, row: dict) -> None:
        print(f"[{i + 1}/{n}] {row['kind']:7s} seqs={int(row['num_seqs']):4d} "
              f"prefill={int(row['num_prefill_tokens']):6d} decode={int(row['num_decode_tokens']):4d} "
              f"max_ctx={int(row['max_context']):6d}  {row['time_s'] * 1e3:9.3f} ms", flush=True)

    # On a terminal a bar counts the runs of shapes; in a log, a line per round over the grid.
    drawing = progress_wanted(args.quiet)
    bar = progress_bar(None, "profiling", unit="run", enabled=drawing)

    def runs(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)
        if done == total:
            bar.close()  # before the rows are listed on stdout

    def rounds(done: int, total: int) -> None:
        if drawing or args.quiet:
            return
        print(f"round {done + 1}/{total} over the grid{' (untimed warm-up)' if done == 0 else ''} "
              f"at {time.perf_counter() - started:.1f} s", flush=True)

    with bar:
        rows = run_profile(
            spec, out=args.out, device=args.device, dtype=args.dtype, block_size=args.block_size,
            max_context=max_context, max_batch=max_batch, quick=args.quick, reps=args.reps, seed=args.seed,
            params=params, progress=progress, round_progress=rounds, run_progress=runs,
        )
    print(f"wrote {len(rows)} shapes to {args.out} in {time.perf_counter() - started:.1f} s")
    for line in format_holdout(holdout_report(read_profile(args.out).rows)):
        print(line)
    return 0
