"""Every GPU check in one go: CUDA tests, engine benchmark, profile, calibrate, validate, summary.

On one H200 (about 7-9 minutes):

  1. pytest tests/test_torch_cuda.py (the fast CUDA paths against the portable ones)
  2. benchmarks/torch_engine.py (speed against the HBM roofline)
  3. servesim profile: Llama-3.1-8B geometry, bf16, random weights -> OUT/profile.csv
  4. servesim calibrate: the roofline fitted to that profile -> OUT/calib.yaml
  5. the saturation throughput of each policy, simulated with the profiled model
  6. servesim validate for continuous batching and chunked prefill at three arrival rates
     (light, near saturation, overloaded) against profiled and the calibrated roofline
  7. a compact summary against the targets: profiled within 3% on p50/p90 TTFT and TPOT and a
     per-step median |error| <= 3% on shapes not in the profile; calibrated roofline within 15%

    python benchmarks/fidelity_gpu.py --out results/fidelity_gpu
    python benchmarks/fidelity_gpu.py --tiny --device cpu --out /tmp/fid   # CPU-sized, ~20 s

On the device machine (simpy and pydantic carried as wheels): see benchmarks/README.md.

Each stage's output goes under OUT; the summary is OUT/summary.json and is printed at the end.
A stage that fails is reported and the rest still run (the exit status is then 1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

TARGETS = {"profiled": 0.03, "roofline": 0.15}
RATE_FACTORS = {"light": 0.3, "near_saturation": 0.9, "overloaded": 1.5}


@dataclass(frozen=True)
class Sizes:
    model: str
    hardware: str
    dtype: str
    profile_args: tuple[str, ...]
    num_requests: int
    light_max_duration_s: float
    prompt: dict
    output: dict
    num_blocks: int
    policies: tuple[dict, ...]
    bench_args: tuple[str, ...]


FULL = Sizes(
    model="llama-3.1-8b", hardware="h200", dtype="bf16", profile_args=(), num_requests=160,
    light_max_duration_s=25.0,
    prompt={"kind": "lognormal", "median": 512, "sigma": 0.8, "min": 16, "max": 4096},
    output={"kind": "lognormal", "median": 128, "sigma": 0.6, "min": 2, "max": 512},
    num_blocks=6144,
    policies=({"name": "continuous", "max_num_seqs": 128, "max_num_batched_tokens": 8192},
              {"name": "chunked_prefill", "chunk_size": 512, "max_num_seqs": 128, "max_num_batched_tokens": 2048}),
    bench_args=(),
)
TINY = Sizes(
    model="tiny-llama", hardware="cpu", dtype="fp32",
    profile_args=("--quick", "--max-context", "256", "--max-batch", "8", "--reps", "3", "--threads", "1"),
    num_requests=10, light_max_duration_s=0.5,
    prompt={"kind": "lognormal", "median": 32, "sigma": 0.5, "min": 4, "max": 128},
    output={"kind": "lognormal", "median": 8, "sigma": 0.5, "min": 2, "max": 24},
    num_blocks=96,
    policies=({"name": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 256},
              {"name": "chunked_prefill", "chunk_size": 32, "max_num_seqs": 8, "max_num_batched_tokens": 64}),
    bench_args=("--tiny", "--reps", "1", "--burst-requests", "4", "--burst-outputs", "3"),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "results/fidelity_gpu")),
                   help="output folder (default: $OUT, else results/fidelity_gpu)")
    p.add_argument("--device", default=None, help="cuda (default) or cpu")
    p.add_argument("--tiny", action="store_true", help="tiny-llama on the CPU, seconds per stage")
    p.add_argument("--profile", type=Path, default=None, help="reuse this profile table instead of profiling")
    p.add_argument("--num-requests", type=int, default=None, help="requests per validate run")
    p.add_argument("--rates", default=None, help="comma-separated arrival rates (req/s) instead of the "
                   "light/near-saturation/overloaded ones derived from the simulated capacity")
    p.add_argument("--skip-pytest", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--export", type=Path, default=None,
                   help="also copy the key files and a .tar.gz of everything, flat, into this folder "
                        "(for the device tool's $OUT, which takes few files and shallow paths)")
    p.add_argument("--deadline-s", type=float, default=450.0,
                   help="start no validate run after this many seconds (the rest are reported as skipped)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sizes = TINY if args.tiny else FULL
    device = args.device or ("cpu" if args.tiny else "cuda")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    summary: dict = {"device": device, "model": sizes.model, "stages": {}, "runs": []}
    ok = True

    def stage(name: str, fn) -> object:  # noqa: ANN001
        nonlocal ok
        t0 = time.perf_counter()
        print(f"\n=== {name} ({t0 - started:.0f} s in)", flush=True)
        try:
            result = fn()
            summary["stages"][name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 1)}
            return result
        except Exception as exc:  # noqa: BLE001 - report and carry on with the other stages
            ok = False
            traceback.print_exc()
            summary["stages"][name] = {"ok": False, "seconds": round(time.perf_counter() - t0, 1),
                                       "error": f"{type(exc).__name__}: {exc}"}
            return None

    if not args.skip_pytest:
        stage("cuda tests", lambda: _pytest(out))
    if not args.skip_bench:
        stage("engine benchmark", lambda: _bench(out, device, sizes))
    profile = args.profile
    if profile is None:
        profile = stage("profile", lambda: _profile(out, device, sizes))
    calib = stage("calibrate", lambda: _calibrate(out, profile, sizes)) if profile else None
    if profile is not None:
        rates = ([float(r) for r in args.rates.split(",")] if args.rates else None)
        plan = stage("capacity", lambda: _rates(out, profile, sizes, rates, args.num_requests))
        for rate_name, rate, num_requests in plan or ():
            if time.perf_counter() - started > args.deadline_s:
                summary["runs"].append({"rate_name": rate_name, "rate": rate, "skipped": "deadline"})
                continue
            result = stage(f"validate {rate_name} ({rate:.3g} req/s)",
                           lambda r=rate, n=rate_name, k=num_requests: _validate(out, device, profile, calib, sizes, n, r, k))
            summary["runs"].append({"rate_name": rate_name, "rate": rate, "num_requests": num_requests,
                                    "report": str(result) if result else None})
    summary["seconds"] = round(time.perf_counter() - started, 1)
    table, verdicts = summarize(summary, out)
    summary["verdicts"] = verdicts
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print("\n" + table)
    print(f"\nall under {out} ({summary['seconds']:.0f} s)")
    if args.export is not None:
        export(out, args.export)
    return 0 if ok else 1


EXPORTED = ("summary.json", "profile.csv", "calib.yaml", "torch_engine.json", "cuda_tests.log")


def export(out: Path, dest: Path) -> None:
    """Copy the key files and an archive of the whole output folder into `dest` (flat)."""
    import shutil
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    for name in EXPORTED:
        if (out / name).exists() and (out / name).resolve() != (dest / name).resolve():
            shutil.copy2(out / name, dest / name)
    with tarfile.open(dest / "fidelity_gpu.tar.gz", "w:gz") as tar:
        tar.add(out, arcname=out.name)
    print(f"exported {', '.join(n for n in EXPORTED if (dest / n).exists())} and fidelity_gpu.tar.gz to {dest}")


# --- stages -----------------------------------------------------------------------------------------


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _run(cmd: list[str], log: Path, timeout: float) -> None:
    print("$ " + " ".join(cmd), flush=True)
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
        f.write(proc.stdout)
    tail = proc.stdout.strip().splitlines()[-25:]
    print("\n".join(tail), flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"exit status {proc.returncode} (log: {log})")


def _pytest(out: Path) -> None:
    _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_torch_cuda.py"],
         out / "cuda_tests.log", timeout=300)


def _bench(out: Path, device: str, sizes: Sizes) -> None:
    _run([sys.executable, "benchmarks/torch_engine.py", "--device", device, *sizes.bench_args,
          "--out", str(out / "torch_engine.json")], out / "torch_engine.log", timeout=300)


def _profile(out: Path, device: str, sizes: Sizes) -> Path:
    path = out / "profile.csv"
    _run([sys.executable, "-m", "experiments.cli", "profile", "--model", sizes.model, "--device", device,
          "--dtype", sizes.dtype, "--out", str(path), *sizes.profile_args], out / "profile.log", timeout=420)
    return path


def _calibrate(out: Path, profile: Path, sizes: Sizes) -> Path:
    from experiments.cli import main as cli

    path = out / "calib.yaml"
    if cli(["calibrate", str(profile), "--model", sizes.model, "--hardware", sizes.hardware, "--out", str(path)]) != 0:
        raise RuntimeError("calibrate failed")
    return path


def experiment(sizes: Sizes, rate: float, num_requests: int, profile: Path) -> dict:
    return {
        "name": "fidelity", "seed": 0, "model": sizes.model, "hardware": sizes.hardware,
        "weight_dtype": sizes.dtype, "kv_cache": {"block_size": 16, "num_blocks": sizes.num_blocks, "dtype": sizes.dtype},
        "workload": {"num_requests": num_requests, "arrivals": {"kind": "poisson", "rate": rate},
                     "prompt_len": sizes.prompt, "output_len": sizes.output},
        "cost_model": {"name": "profiled", "table": str(profile.resolve())},
        "policies": [dict(p) for p in sizes.policies],
        "output": {"plots": False},
    }


def _rates(out: Path, profile: Path, sizes: Sizes, given: list[float] | None,
           num_requests: int | None) -> list[tuple[str, float, int]]:
    """(name, rate, requests) per validate run: from the profiled model's simulated saturation."""
    n = num_requests or sizes.num_requests
    if given:
        return [(f"rate_{r:g}", r, n) for r in given]
    from experiments.config import parse_experiment
    from experiments.runner import run_experiment

    # Everything arrives at once: the completion rate is the policy's throughput ceiling.
    data = experiment(sizes, 1e6, max(n, 64), profile)
    run = run_experiment(parse_experiment(data, source=None))
    capacity = min(r.summary["request_throughput"] for r in run.runs)
    print("simulated saturation throughput (profiled): "
          + ", ".join(f"{r.label} {r.summary['request_throughput']:.3g} req/s" for r in run.runs))
    (out / "capacity.json").write_text(json.dumps({r.label: r.summary["request_throughput"] for r in run.runs}))
    plan = []
    for name, factor in RATE_FACTORS.items():
        rate = capacity * factor
        count = n if name != "light" else max(min(n, int(math.ceil(rate * sizes.light_max_duration_s))), 8)
        plan.append((name, rate, count))
    return plan


def _validate(out: Path, device: str, profile: Path, calib: Path | None, sizes: Sizes, name: str,
              rate: float, num_requests: int) -> Path:
    from experiments.cli import main as cli

    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "experiment.yaml"
    path.write_text(yaml.safe_dump(experiment(sizes, rate, num_requests, profile), sort_keys=False))
    argv = ["validate", str(path), "--device", device, "--out", str(folder), "--profile", str(profile), "--quiet"]
    argv += ["--against", "profiled,roofline"]
    if calib is not None:
        argv += ["--calibration", str(calib)]
    if cli(argv) != 0:
        raise RuntimeError(f"validate {name} failed")
    return folder / "fidelity.json"


# --- the summary ---------------------------------------------------------------------------------------


def _verdict(value: float | None, target: float) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return "ok" if abs(value) <= target else "MISS"


def summarize(summary: dict, out: Path) -> tuple[str, list[dict]]:
    """One line per (rate, policy, model): TTFT/TPOT p50/p90 errors, per-step median |error|, verdict."""
    head = (f"{'load':16s} {'req/s':>7s} {'policy':16s} {'vs':9s} {'TTFT p50':>9s} {'TTFT p90':>9s} {'TPOT p50':>9s} "
            f"{'TPOT p90':>9s} {'step med':>9s} {'(unseen)':>9s} {'target':>7s}  verdict")
    lines = ["fidelity summary: (predicted - measured) / measured; step med = median |error| of the real "
             "run's steps, unseen = on shapes not in the profile", head, "-" * len(head)]
    verdicts = []
    for run in summary["runs"]:
        if run.get("skipped") or not run.get("report") or not Path(run["report"]).exists():
            lines.append(f"{run['rate_name']:16s} {run['rate']:7.3g} (not run: {run.get('skipped') or 'failed'})")
            continue
        report = json.loads(Path(run["report"]).read_text())
        for label, entry in report["policies"].items():
            for name, comp in entry["against"].items():
                e2e, steps = comp["end_to_end"], comp["steps"]
                errors = [e2e[m][s]["rel_error"] for m in ("ttft", "tpot") for s in ("p50", "p90")]
                step_all = steps["all"].get("median_abs_rel_error")
                unseen = steps["not_in_profile"].get("median_abs_rel_error")
                target = TARGETS[name]
                checks = [*errors, unseen if name == "profiled" else step_all]
                verdict = "ok" if all(_verdict(v, target) == "ok" for v in checks) else (
                    "n/a" if any(v is None for v in checks) else "MISS")
                verdicts.append({"rate": run["rate_name"], "policy": label, "against": name, "verdict": verdict,
                                 "errors": dict(zip(("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"), errors,
                                                    strict=True)),
                                 "step_median_abs": step_all, "step_median_abs_unseen": unseen})
                cells = " ".join(f"{_fmt(v, signed=True):>9s}" for v in errors)
                lines.append(f"{run['rate_name']:16s} {run['rate']:7.3g} {label:16s} {name:9s} "
                             f"{cells} {_fmt(step_all):>9s} {_fmt(unseen):>9s} {target:>7.0%}  {verdict}")
    for stage_name, info in summary["stages"].items():
        lines.append(f"stage {stage_name}: {'ok' if info['ok'] else 'FAILED: ' + info.get('error', '')} "
                     f"({info['seconds']} s)")
    return "\n".join(lines), verdicts


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
