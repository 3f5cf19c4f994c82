"""Every GPU check in one command that runs as checked in: no files the repo lacks, no network needed.

On one H200, within `--deadline-s` (default 530 s; the device tool allows 600):

  0. dependencies: simpy, pydantic and PyYAML, if the image lacks them, from the registry, else
     from the wheels committed in benchmarks/wheels/ (into a temporary --target folder)
  1. pytest tests/test_torch_cuda.py (the fast CUDA paths against the portable ones)
  2. our engine, Llama-3.1-8B shape, random bf16 weights: decode step time at batch 1/64/256 and
     context 512/2048, eager and with CUDA graphs, each against the HBM roofline (4.8 TB/s); a
     256-request burst in output tokens/s against its own bound (prompt FLOPs at peak plus decode
     bytes at HBM bandwidth)
  3. transformers on the same decode shapes (random weights, a KV cache filled at random)
  4. prefill: what a prompt shape costs the first time the engine meets it against a repeat, with
     cuDNN attention excluded (the engine's default) and allowed, and which SDPA kernel torch picks
     for each attention form of prompt pieces (the first H200 run's prefill steps paid a cuDNN plan
     build at almost every new prompt length)
  5. servesim profile (CUDA graphs on) -> calibrate -> the simulated saturation throughput ->
     servesim validate at a light, a near-saturation and an overloaded rate (CUDA graphs on),
     against the profiled table and the calibrated roofline
  6. a summary against the targets (summary.json, printed)

Every measurement is one JSON line in OUT/measurements.jsonl (and EXPORT/measurements.jsonl),
flushed as it is taken, so a run cut short still returns what it measured. A stage that fails
is reported and the others still run; no stage starts after the deadline, and a running one is
stopped there (either way the exit status is 1).

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out results/gpu --export $OUT
    python benchmarks/gpu_check.py --tiny --device cpu --out /tmp/gpu   # the whole sequence on a CPU
    # about 5 minutes: the CUDA tests, the prefill costs and the fidelity chain only
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --stages cuda-tests,prefill,profile,validate \
        --out results/gpu --export $OUT

Only the standard library is imported before the dependency check.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.machinery
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = Path(__file__).resolve().parent / "wheels"
DEPS_DIR = Path(tempfile.gettempdir()) / "servesim-gpu-check-deps"

# Module -> the distributions it needs: exactly the wheels in benchmarks/wheels/ (see its README).
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "simpy": ("simpy==4.1.2",),
    "pydantic": ("pydantic==2.14.4", "pydantic_core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
                 "typing_extensions==4.16.0"),
    "yaml": ("PyYAML==6.0.4",),
}

TARGETS = {"profiled": 0.03, "roofline": 0.15}
# Stages --stages and --skip name; validate includes calibrate and capacity, "fidelity" means profile and validate.
STAGES = ("cuda-tests", "engine", "transformers", "prefill", "profile", "validate")
RATE_FACTORS = {"light": 0.3, "near_saturation": 0.9, "overloaded": 1.5}
HBM_BYTES_PER_S = 4.8e12  # H200 datasheet


# --- dependencies (standard library only) ---------------------------------------------------------


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _on_path(target: Path) -> None:
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(target) not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(target), *parts])  # for the stages' subprocesses
    importlib.invalidate_caches()


def _pip(args: list[str], timeout: float) -> bool:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
           "--no-cache-dir", "--no-deps", "--upgrade", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _unzip_wheels(requirements: list[str], wheels: Path, target: Path) -> None:
    """A wheel is a zip of what goes into site-packages: the fallback when pip itself is missing."""
    wanted = {_canonical(r.split("==")[0]): r.split("==")[1] for r in requirements}
    for wheel in sorted(wheels.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        if wanted.get(_canonical(name)) == version:
            with zipfile.ZipFile(wheel) as z:
                z.extractall(target)


def ensure_dependencies(requirements: dict[str, tuple[str, ...]] | None = None, *, target: Path = DEPS_DIR,
                        wheels: Path = WHEELS, registry: bool = True, is_missing=None, log=print) -> dict:  # noqa: ANN001
    """Make every module of `requirements` importable; returns what was missing and where it came from.

    A missing module is installed (with its pinned dependencies, --no-deps) into `target`, which goes
    first on sys.path and PYTHONPATH: from the registry, else from the committed wheels with pip
    --no-index, else by unzipping those wheels. `is_missing(module)` decides what counts as missing
    (default: not importable here)."""
    requirements = REQUIREMENTS if requirements is None else requirements

    def importable(module: str) -> bool:
        try:
            importlib.import_module(module)
            return True
        except ImportError:
            return False

    is_missing = is_missing or (lambda m: not importable(m))
    missing = [m for m in requirements if is_missing(m)]
    if not missing:
        return {"missing": [], "source": None}
    target.mkdir(parents=True, exist_ok=True)

    def in_target() -> bool:
        return all(importlib.machinery.PathFinder.find_spec(m, [str(target)]) is not None for m in missing)

    reqs = sorted({r for m in missing for r in requirements[m]})
    log(f"missing {', '.join(missing)}: installing {' '.join(reqs)} into {target}")
    source = None
    if in_target():
        source = "earlier install"
    elif registry and _pip(["--retries", "0", "--timeout", "15", "--target", str(target), *reqs], timeout=180) \
            and in_target():
        source = "registry"
    elif _pip(["--no-index", "--find-links", str(wheels), "--target", str(target), *reqs], timeout=120) and in_target():
        source = "wheels (pip)"
    else:
        _unzip_wheels(reqs, wheels, target)
        source = "wheels (unzipped)" if in_target() else None
    if source is None:
        raise RuntimeError(f"could not install {reqs} into {target} (registry, then {wheels})")
    _on_path(target)
    log(f"dependencies from {source}")
    return {"missing": missing, "source": source, "target": str(target), "requirements": reqs}


# --- JSON lines ---------------------------------------------------------------------------------------


class Lines:
    """Appends one JSON object a line to each file, flushed at once (a cut run keeps every line)."""

    def __init__(self, paths: list[Path], started: float, fresh: bool = False) -> None:
        self.paths, self.started = paths, started
        for p in paths:
            p.parent.mkdir(parents=True, exist_ok=True)
            if fresh:
                p.write_text("")

    def write(self, record: dict) -> None:
        line = json.dumps({**record, "t_s": round(time.time() - self.started, 1)}, default=str)
        for p in self.paths:
            with p.open("a") as f:
                f.write(line + "\n")
                f.flush()
        print("measured " + line, flush=True)


# --- sizes ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    model: str
    hardware: str
    dtype: str
    decode_cases: tuple[tuple[int, int], ...]  # (batch, context)
    reps: int
    burst_requests: int  # prompts and outputs as in benchmarks/torch_engine.py (FULL or TINY there)
    burst_outputs: int
    profile_args: tuple[str, ...]
    num_requests: int
    light_max_duration_s: float
    prompt: dict
    output: dict
    num_blocks: int
    policies: tuple[dict, ...]


FULL = Sizes(
    model="llama-3.1-8b", hardware="h200", dtype="bf16",
    decode_cases=tuple((b, c) for b in (1, 64, 256) for c in (512, 2048)), reps=10, burst_requests=256,
    burst_outputs=128,
    profile_args=("--quick",), num_requests=160, light_max_duration_s=25.0,
    prompt={"kind": "lognormal", "median": 512, "sigma": 0.8, "min": 16, "max": 4096},
    output={"kind": "lognormal", "median": 128, "sigma": 0.6, "min": 2, "max": 512},
    num_blocks=6144,
    policies=({"name": "continuous", "max_num_seqs": 128, "max_num_batched_tokens": 8192},
              {"name": "chunked_prefill", "chunk_size": 512, "max_num_seqs": 128, "max_num_batched_tokens": 2048}),
)
TINY = Sizes(
    model="tiny-llama", hardware="cpu", dtype="fp32",
    decode_cases=tuple((b, c) for b in (1, 8) for c in (64, 256)), reps=2, burst_requests=4, burst_outputs=3,
    profile_args=("--quick", "--max-context", "256", "--max-batch", "8", "--reps", "3", "--threads", "1"),
    num_requests=10, light_max_duration_s=0.5,
    prompt={"kind": "lognormal", "median": 32, "sigma": 0.5, "min": 4, "max": 128},
    output={"kind": "lognormal", "median": 8, "sigma": 0.5, "min": 2, "max": 24},
    num_blocks=96,
    policies=({"name": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 256},
              {"name": "chunked_prefill", "chunk_size": 32, "max_num_seqs": 8, "max_num_batched_tokens": 64}),
)

# Longest each stage may run (seconds), on top of the overall deadline.
STAGE_LIMITS = {"cuda tests": 150, "engine eager": 150, "engine graphs": 180, "transformers": 120, "prefill": 150,
                "profile": 180, "validate": 240}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results/gpu"), help="output folder (default results/gpu)")
    p.add_argument("--export", type=Path, default=None,
                   help="also write measurements.jsonl here as it goes, and the key files and a .tar.gz of "
                        "everything at the end, flat (for the device tool's $OUT)")
    p.add_argument("--device", default=None, help="cuda (default) or cpu")
    p.add_argument("--tiny", action="store_true", help="tiny-llama, seconds per stage (with --device cpu: CI)")
    p.add_argument("--deadline-s", type=float, default=530.0,
                   help="no stage starts after this many seconds, and a running one is stopped there")
    p.add_argument("--profile", type=Path, default=None, help="reuse this profile table instead of profiling")
    p.add_argument("--num-requests", type=int, default=None, help="requests per validate run")
    p.add_argument("--rates", default=None, help="comma-separated arrival rates (req/s) instead of the "
                   "light/near-saturation/overloaded ones derived from the simulated capacity")
    p.add_argument("--stages", default="all", help=f"comma-separated stages to run (default all): {', '.join(STAGES)}; "
                   "'fidelity' is profile,validate (validate needs profile or --profile)")
    p.add_argument("--skip", default="", help="comma-separated stages to leave out (names as for --stages)")
    p.add_argument("--rate-names", default=None, help="comma-separated validate loads to run, of "
                   f"{', '.join(RATE_FACTORS)} (default all)")
    p.add_argument("--no-registry", action="store_true", help="install missing dependencies from the wheels only")
    p.add_argument("--stage", default=None, help=argparse.SUPPRESS)  # a child process runs one stage
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sizes = TINY if args.tiny else FULL
    device = args.device or ("cpu" if args.tiny else "cuda")
    out = args.out.resolve()
    files = [out / "measurements.jsonl"] + ([args.export.resolve() / "measurements.jsonl"] if args.export else [])
    if args.stage is not None:  # a child: its parent checked the dependencies
        lines = Lines(files, float(os.environ.get("GPU_CHECK_STARTED", time.time())))
        return run_child(args.stage, lines, sizes, device)
    started = time.time()
    os.environ["GPU_CHECK_STARTED"] = str(started)
    lines = Lines(files, started, fresh=True)
    lines.write({"kind": "start", "argv": sys.argv[1:] if argv is None else argv, "python": sys.version.split()[0],
                 "device": device, "model": sizes.model, "deadline_s": args.deadline_s})
    skip = set(STAGES) - selected_stages(args.stages, args.skip)
    if "validate" not in skip and "profile" in skip and args.profile is None:
        raise SystemExit("the validate stage needs a profile: select the profile stage too, or pass --profile")
    summary: dict = {"device": device, "model": sizes.model, "stages": {}, "runs": []}
    ok = True

    def left() -> float:
        return args.deadline_s - (time.time() - started)

    def stage(name: str, fn, limit: float | None = None) -> object:  # noqa: ANN001
        nonlocal ok
        t0 = time.time()
        if left() <= 5:  # not done: the exit status says so
            ok = False
            summary["stages"][name] = {"ok": False, "skipped": "deadline"}
            lines.write({"kind": "stage", "stage": name, "ok": False, "skipped": "deadline"})
            return None
        print(f"\n=== {name} ({t0 - started:.0f} s in, {left():.0f} s left)", flush=True)
        try:
            result = fn(min(left(), limit or left()))
            info = {"ok": True, "seconds": round(time.time() - t0, 1)}
        except Exception as exc:  # noqa: BLE001 - report and carry on with the other stages
            ok = False
            traceback.print_exc()
            result = None
            info = {"ok": False, "seconds": round(time.time() - t0, 1), "error": f"{type(exc).__name__}: {exc}"[:2000]}
        summary["stages"][name] = info
        lines.write({"kind": "stage", "stage": name, **info})
        return result

    deps = stage("dependencies", lambda _: ensure_dependencies(registry=not args.no_registry))
    if deps:
        lines.write({"kind": "dependencies", **deps})
    if "cuda-tests" not in skip:
        stage("cuda tests", lambda t: _pytest(out, lines, args.export, t), STAGE_LIMITS["cuda tests"])
    if "engine" not in skip:
        stage("engine eager", lambda t: _child("engine-eager", args, t, out), STAGE_LIMITS["engine eager"])
        if device.startswith("cuda"):
            stage("engine graphs", lambda t: _child("engine-graphs", args, t, out), STAGE_LIMITS["engine graphs"])
        else:
            lines.write({"kind": "skipped", "what": "engine with cuda graphs", "why": "needs CUDA"})
    if "transformers" not in skip:
        stage("transformers", lambda t: _child("transformers", args, t, out), STAGE_LIMITS["transformers"])
    if "prefill" not in skip:
        stage("prefill", lambda t: _child("prefill", args, t, out), STAGE_LIMITS["prefill"])
    if "validate" not in skip or "profile" not in skip:
        fidelity(args, sizes, device, out, summary, stage, left, lines, validate="validate" not in skip,
                 profile_stage="profile" not in skip)
    summary["seconds"] = round(time.time() - started, 1)
    summary["measurements"] = read_lines(out / "measurements.jsonl")
    table, verdicts = summarize(summary)
    summary["verdicts"] = verdicts
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print("\n" + table)
    print(f"\nall under {out} ({summary['seconds']:.0f} s)")
    if args.export is not None:
        export(out, args.export)
    lines.write({"kind": "end", "ok": ok, "seconds": summary["seconds"]})
    return 0 if ok else 1


def selected_stages(stages: str, skip: str = "") -> set[str]:
    """The stages to run: --stages (all, or names; 'fidelity' is profile and validate) less --skip."""

    def names(text: str) -> set[str]:
        out: set[str] = set()
        for name in (n.strip() for n in text.split(",") if n.strip()):
            expanded = set(STAGES) if name == "all" else {"profile", "validate"} if name == "fidelity" else {name}
            unknown = expanded - set(STAGES)
            if unknown:
                raise SystemExit(f"unknown stage {name!r}; expected some of {', '.join(STAGES)}, all or fidelity")
            out |= expanded
        return out

    return names(stages) - names(skip)


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


EXPORTED = ("summary.json", "profile.csv", "calib.yaml", "cuda_tests.log")


def export(out: Path, dest: Path) -> None:
    """Copy the key files and an archive of the whole output folder into `dest` (flat)."""
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    for name in EXPORTED:
        if (out / name).exists() and (out / name).resolve() != (dest / name).resolve():
            shutil.copy2(out / name, dest / name)
    with tarfile.open(dest / "gpu_check.tar.gz", "w:gz") as tar:
        tar.add(out, arcname=out.name)
    print(f"exported {', '.join(n for n in EXPORTED if (dest / n).exists())}, measurements.jsonl and "
          f"gpu_check.tar.gz to {dest}")


# --- stages run in subprocesses (a deadline can stop them; the GPU's memory is theirs alone) ----------


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _run(cmd: list[str], log: Path, timeout: float, tail: int = 25) -> subprocess.CompletedProcess:
    """Run `cmd` with its output to `log` and the terminal; stop it after `timeout` seconds."""
    print("$ " + " ".join(cmd), flush=True)
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            stdout, _ = proc.communicate()
            f.write(stdout)
            raise RuntimeError(f"stopped after {timeout:.0f} s (log: {log})") from None
        f.write(stdout)
    print("\n".join(stdout.strip().splitlines()[-tail:]), flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"exit status {proc.returncode} (log: {log})")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout)


def _pytest(out: Path, lines: Lines, export_to: Path | None, timeout: float) -> None:
    log = out / "cuda_tests.log"
    try:
        _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_torch_cuda.py"], log, timeout)
    finally:
        text = log.read_text().strip() if log.exists() else ""
        last = text.splitlines()[-1] if text else ""
        counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last)}
        lines.write({"kind": "cuda_tests", **counts, "summary": last})
        if export_to is not None and log.exists():
            shutil.copy2(log, export_to / log.name)


def _child(name: str, args: argparse.Namespace, timeout: float, out: Path) -> None:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", name, "--out", str(out),
           "--device", args.device or ("cpu" if args.tiny else "cuda")]
    cmd += ["--tiny"] if args.tiny else []
    cmd += ["--export", str(args.export.resolve())] if args.export else []
    _run(cmd, out / f"{name}.log", timeout)


def run_child(name: str, lines: Lines, sizes: Sizes, device: str) -> int:
    sys.path.insert(0, str(ROOT))
    if name in ("engine-eager", "engine-graphs"):
        engine_stage(lines, sizes, device, graphs=name == "engine-graphs")
    elif name == "transformers":
        transformers_stage(lines, sizes, device)
    elif name == "prefill":
        prefill_stage(lines, sizes, device)
    else:
        raise SystemExit(f"unknown stage {name!r}")
    return 0


def engine_stage(lines: Lines, sizes: Sizes, device: str, graphs: bool) -> None:
    """Decode steps against the HBM roofline, then the burst (each mode in its own process)."""
    from backends.base import CostContext
    from backends.torch.factory import make_torch
    from backends.torch.profile import ShapeRunner, StepShape
    from benchmarks import torch_engine as bench
    from simcore.presets import get_model

    spec = get_model(sizes.model)
    block_size = 16
    burst = dataclasses.replace(bench.TINY if sizes.model == "tiny-llama" else bench.FULL,
                                burst_requests=sizes.burst_requests, burst_outputs=sizes.burst_outputs)
    decode_blocks = max(b * -(-(c + 1) // block_size) for b, c in sizes.decode_cases)
    num_blocks = max(decode_blocks, bench.pool_blocks(burst, block_size)) + 1
    ctx = CostContext(model=spec, hardware_name=device, block_size=block_size, num_blocks=num_blocks)
    t0 = time.time()
    cost_model = make_torch({"device": device, "dtype": sizes.dtype, "cuda_graphs": graphs}, ctx)
    engine = cost_model.engine
    mode = {"engine": "servesim", "cuda_graphs": engine.graphs is not None,
            "attention": engine.decode_backend.name, "model": spec.name, "dtype": sizes.dtype}
    lines.write({"kind": "engine_built", **mode, "seconds": round(time.time() - t0, 1), "num_blocks": num_blocks})
    dtype_bytes = 4 if sizes.dtype == "fp32" else 2
    runner = ShapeRunner(cost_model)
    for b, c in sizes.decode_cases:
        wall, gpu = runner.time(StepShape("decode", decodes=(c,) * b), sizes.reps)
        roof = bench.step_bytes(spec, dtype_bytes, b * (c + 1)) / HBM_BYTES_PER_S
        lines.write({"kind": "decode", **mode, "batch": b, "context": c, "step_s": wall, "gpu_s": gpu,
                     "roofline_hbm_s": roof, "x_roofline": wall / roof})
    lines.write({"kind": "burst", **mode, **bench.run_burst(cost_model, spec, burst, dtype_bytes)})


def sdpa_forms(spec, device: str, dtype, query_len: int, key_len: int) -> dict:  # noqa: ANN001
    """The SDPA calls a prompt piece makes, as (q, k, v, mask, is_causal, enable_gqa), in the engine's layouts."""
    import torch

    from backends.torch.attention import repeat_heads

    hq, hkv, d = spec.num_q_heads, spec.num_kv_heads, spec.head_dim

    def heads(n: int, length: int):  # noqa: ANN202 - [1, H, L, d] as a transposed [1, L, H, d], like the engine's
        return torch.randn(1, length, n, d, device=device, dtype=dtype).transpose(1, 2)

    q, k, v = heads(hq, query_len), heads(hkv, key_len), heads(hkv, key_len)
    positions = torch.arange(key_len - query_len, key_len, device=device)
    mask = (torch.arange(key_len, device=device)[None, :] <= positions[:, None])[None, None]
    fresh = (q, heads(hkv, query_len), heads(hkv, query_len), None, True, hq != hkv)
    return {"fresh piece (is_causal)": fresh,
            "continued piece (mask, grouped heads)": (q, k, v, mask, False, hq != hkv),
            "continued piece (mask, repeated K/V)": (q, repeat_heads(k, hq // hkv), repeat_heads(v, hq // hkv), mask,
                                                     False, False)}


def sdpa_choice(q, k, v, mask, is_causal: bool, enable_gqa: bool) -> str:  # noqa: ANN001
    """The SDPA kernel torch would run for these inputs under the current backend settings."""
    import torch
    from torch.nn.attention import SDPBackend

    try:
        index = torch._fused_sdp_choice(q, k, v, mask, 0.0, is_causal, scale=None, enable_gqa=enable_gqa)
    except Exception as exc:  # noqa: BLE001 - a private API: report what it said instead of failing the stage
        return f"unknown ({type(exc).__name__})"
    return next((name for name, b in SDPBackend.__members__.items() if int(b) == int(index)), str(index))


def prefill_stage(lines: Lines, sizes: Sizes, device: str) -> None:
    """What a prompt shape costs the first time the engine meets it, against a repeat, with cuDNN attention
    excluded (the engine's default) and allowed; and the SDPA kernel torch picks for each prompt-piece form.

    Each mode gets its own prompt lengths and contexts (cuDNN's plan cache is per process), and one untimed
    shape first, so that neither pays library start-up in its timed first calls."""
    import statistics

    import torch

    from backends.base import CostContext
    from backends.torch.attention import sdpa_backends
    from backends.torch.factory import make_torch
    from backends.torch.profile import ShapeRunner, StepShape
    from simcore.presets import get_model

    spec = get_model(sizes.model)
    base = int(sizes.prompt["median"])
    chunk = int(next((p["chunk_size"] for p in sizes.policies if "chunk_size" in p), base))
    count, repeats = (6, 3) if sizes.model != "tiny-llama" else (2, 1)

    def shapes(mode: int) -> list[tuple[str, StepShape]]:
        # Odd lengths and contexts no warm-up, profile or other mode uses.
        offsets = [7 * (2 * i + mode) + 3 for i in range(count + 1)]
        fresh = [("fresh", StepShape("prefill", prefill=((base + o, 0),))) for o in offsets]
        continued = [("continued", StepShape("prefill", prefill=((chunk, base + 2 * o),))) for o in offsets]
        # A first chunk (a shape met before) beside decode rows of a new count and table width: what is
        # new here is the GEMMs' row count and the eager Triton decode call's arguments.
        mixed = [("mixed", StepShape("mixed", prefill=((chunk, 0),), decodes=(base + 16 * o,) * (1 + o % 16)))
                 for o in offsets]
        return fresh + continued + mixed

    blocks = max(shape.num_blocks(16) for mode in (0, 1) for _, shape in shapes(mode))
    ctx = CostContext(model=spec, hardware_name=device, block_size=16, num_blocks=blocks + 1)
    graphs = device.startswith("cuda")
    cost_model = make_torch({"device": device, "dtype": sizes.dtype, "cuda_graphs": graphs}, ctx)
    runner = ShapeRunner(cost_model)
    info = {"model": spec.name, "dtype": sizes.dtype, "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version() if graphs else None}
    for mode, allow in enumerate((False, True)):
        cost_model.engine.allow_cudnn_attention = allow
        firsts: dict[str, list[float]] = {"fresh": [], "continued": [], "mixed": []}
        again: dict[str, list[float]] = {"fresh": [], "continued": [], "mixed": []}
        for n, (form, shape) in enumerate(shapes(mode)):
            first, first_gpu = runner.run_once(shape)
            if n % (count + 1) == 0:
                continue  # the untimed shape of each form
            walls = [runner.run_once(shape)[0] for _ in range(repeats)]
            ((q, c),) = shape.prefill
            lines.write({"kind": "prefill_first_call", **info, "allow_cudnn": allow, "form": form, "tokens": q,
                         "context": c, "decode_rows": len(shape.decodes), "first_s": first, "first_gpu_s": first_gpu,
                         "repeat_s": statistics.median(walls)})
            firsts[form].append(first)
            again[form].append(statistics.median(walls))
        for form in firsts:
            lines.write({"kind": "prefill_first_call_summary", **info, "allow_cudnn": allow, "form": form,
                         "shapes": len(firsts[form]), "first_median_s": statistics.median(firsts[form]),
                         "repeat_median_s": statistics.median(again[form]),
                         "first_over_repeat": statistics.median(f / r for f, r in zip(firsts[form], again[form],
                                                                                      strict=True))})
    dtype = cost_model.engine.model.dtype
    for form, args in sdpa_forms(spec, device, dtype, chunk, chunk + base).items():
        chosen = {"torch default": sdpa_choice(*args)}
        with sdpa_backends(torch.device(device)):
            chosen["engine (no cuDNN)"] = sdpa_choice(*args)
        lines.write({"kind": "sdpa_choice", **info, "form": form, "query_len": chunk, "key_len": chunk + base,
                     **chosen})


def transformers_stage(lines: Lines, sizes: Sizes, device: str) -> None:
    """transformers' decode step on the same shapes: random weights, a KV cache filled at random."""
    import statistics

    import torch
    import transformers

    from simcore.presets import get_model

    transformers.logging.set_verbosity_error()
    spec = get_model(sizes.model)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[sizes.dtype]
    config = transformers.LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_q_heads, num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim, max_position_embeddings=spec.max_position_embeddings, rms_norm_eps=spec.rms_norm_eps,
        tie_word_embeddings=spec.tie_word_embeddings,
    )
    t0 = time.time()
    torch.manual_seed(0)
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    hf = hf.to(device).eval()  # a no-op where the device context already placed it
    info = {"engine": "transformers", "transformers": transformers.__version__, "model": spec.name, "dtype": sizes.dtype,
            "cache": "dynamic", "attention": hf.config._attn_implementation}
    lines.write({"kind": "engine_built", **info, "seconds": round(time.time() - t0, 1)})
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    dtype_bytes = torch.finfo(dtype).bits // 8
    from benchmarks.torch_engine import step_bytes

    for b, c in sizes.decode_cases:
        cache = transformers.DynamicCache()
        with torch.inference_mode():
            for layer in range(spec.num_layers):
                k = torch.randn(b, spec.num_kv_heads, c, spec.head_dim, device=device, dtype=dtype)
                cache.update(k, torch.randn_like(k), layer)
            del k
            tokens = torch.zeros(b, 1, dtype=torch.long, device=device)
            times = []
            for _ in range(sizes.reps + 1):
                sync()
                t = time.perf_counter()
                logits = hf(input_ids=tokens, past_key_values=cache, use_cache=True).logits
                tokens = logits[:, -1:].argmax(-1)
                tokens.tolist()  # as generate() does each step
                times.append(time.perf_counter() - t)
        wall = statistics.median(times[1:])
        roof = step_bytes(spec, dtype_bytes, b * (c + 1)) / HBM_BYTES_PER_S
        lines.write({"kind": "decode", **info, "batch": b, "context": c, "step_s": wall, "roofline_hbm_s": roof,
                     "x_roofline": wall / roof})
        del cache, logits
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


# --- fidelity: profile, calibrate, capacity, validate ---------------------------------------------------


def fidelity(args, sizes: Sizes, device: str, out: Path, summary: dict, stage, left, lines: Lines, *,  # noqa: ANN001
             validate: bool = True, profile_stage: bool = True) -> None:
    graphs = device.startswith("cuda")
    profile = args.profile
    if profile is None and profile_stage:
        profile = stage("profile", lambda t: _profile(out, device, sizes, graphs, t, args.export), STAGE_LIMITS["profile"])
    elif profile is None:
        lines.write({"kind": "skipped", "what": "validate", "why": "no profile: run the profile stage or pass --profile"})
        return
    calib = stage("calibrate", lambda _: _calibrate(out, profile, sizes)) if profile else None
    if profile is None or not validate:
        return
    rates = [float(r) for r in args.rates.split(",")] if args.rates else None
    names = [n.strip() for n in args.rate_names.split(",") if n.strip()] if args.rate_names else None
    plan = stage("capacity", lambda _: _rates(out, profile, sizes, rates, args.num_requests, lines, names))
    for rate_name, rate, num_requests in plan or ():
        name = f"validate {rate_name} ({rate:.3g} req/s)"
        report = stage(name, lambda t, r=rate, n=rate_name, k=num_requests: _validate(
            out, device, profile, calib, sizes, n, r, k, graphs, t), STAGE_LIMITS["validate"])
        summary["runs"].append({"rate_name": rate_name, "rate": rate, "num_requests": num_requests,
                                "report": str(report) if report else None,
                                **({"skipped": "deadline"} if summary["stages"][name].get("skipped") else {})})
        if report:
            for v in fidelity_rows(rate_name, rate, json.loads(Path(report).read_text())):
                lines.write({"kind": "fidelity", **v})


def _profile(out: Path, device: str, sizes: Sizes, graphs: bool, timeout: float, export_to: Path | None) -> Path:
    path = out / "profile.csv"
    _run([sys.executable, "-m", "experiments.cli", "profile", "--model", sizes.model, "--device", device,
          "--dtype", sizes.dtype, "--out", str(path), "--quiet", *(["--cuda-graphs"] if graphs else []),
          *sizes.profile_args], out / "profile.log", timeout)
    if export_to is not None:
        shutil.copy2(path, export_to / path.name)
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


def _rates(out: Path, profile: Path, sizes: Sizes, given: list[float] | None, num_requests: int | None,
           lines: Lines, names: list[str] | None = None) -> list[tuple[str, float, int]]:
    """(name, rate, requests) per validate run: from the profiled model's simulated saturation (the loads
    `names` of RATE_FACTORS only, when given)."""
    n = num_requests or sizes.num_requests
    if given:
        return [(f"rate_{r:g}", r, n) for r in given]
    from experiments.config import parse_experiment
    from experiments.runner import run_experiment

    # Everything arrives at once: the completion rate is the policy's throughput ceiling.
    run = run_experiment(parse_experiment(experiment(sizes, 1e6, max(n, 64), profile), source=None))
    capacity = {r.label: r.summary["request_throughput"] for r in run.runs}
    (out / "capacity.json").write_text(json.dumps(capacity))
    lines.write({"kind": "capacity", "request_throughput": capacity})
    lowest = min(capacity.values())
    unknown = set(names or ()) - set(RATE_FACTORS)
    if unknown:
        raise ValueError(f"unknown load {sorted(unknown)}; expected some of {', '.join(RATE_FACTORS)}")
    plan = []
    for name, factor in RATE_FACTORS.items():
        if names is not None and name not in names:
            continue
        rate = lowest * factor
        count = n if name != "light" else max(min(n, int(math.ceil(rate * sizes.light_max_duration_s))), 8)
        plan.append((name, rate, count))
    return plan


def _validate(out: Path, device: str, profile: Path, calib: Path | None, sizes: Sizes, name: str, rate: float,
              num_requests: int, graphs: bool, timeout: float) -> Path:
    import yaml

    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "experiment.yaml"
    path.write_text(yaml.safe_dump(experiment(sizes, rate, num_requests, profile), sort_keys=False))
    cmd = [sys.executable, "-m", "experiments.cli", "validate", str(path), "--device", device, "--out", str(folder),
           "--profile", str(profile), "--quiet", "--against", "profiled,roofline"]
    if graphs:
        cmd += ["--engine", "cuda_graphs=true"]
    if calib is not None:
        cmd += ["--calibration", str(calib)]
    _run(cmd, folder / "validate.log", timeout, tail=40)
    return folder / "fidelity.json"


# --- the summary --------------------------------------------------------------------------------------


def fidelity_rows(rate_name: str, rate: float, report: dict) -> list[dict]:
    """One row per (policy, model compared): TTFT/TPOT p50/p90 errors, per-step median |error|, verdict."""
    rows = []
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
            prompt = steps.get("prompt", {})
            rows.append({"rate": rate_name, "rate_req_s": rate, "policy": label, "against": name, "verdict": verdict,
                         "target": target,
                         "errors": dict(zip(("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"), errors, strict=True)),
                         "step_median_abs": step_all, "step_median_abs_unseen": unseen,
                         "prompt_time_share": prompt.get("time_share"), "prompt_time_error": prompt.get("time_rel_error")})
    return rows


def _verdict(value: float | None, target: float) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return "ok" if abs(value) <= target else "MISS"


def summarize(summary: dict) -> tuple[str, list[dict]]:
    """The measurements as tables: decode steps, bursts, fidelity against the targets, stages."""
    ms = summary.get("measurements", [])
    lines = []
    decode = [m for m in ms if m.get("kind") == "decode"]
    if decode:
        lines.append("decode step (median): ms, and x the HBM roofline (weights + KV read at 4.8 TB/s)")
    names = []
    for m in decode:
        key = (m["engine"], bool(m.get("cuda_graphs")))
        if key not in names:
            names.append(key)
    label = {k: f"{k[0]}{' graphs' if k[1] else (' eager' if k[0] == 'servesim' else '')}" for k in names}
    head = f"{'batch':>5s} {'context':>7s} {'roofline ms':>11s} " + " ".join(f"{label[k]:>22s}" for k in names)
    lines += [head, "-" * len(head)] if decode else []
    for b, c in sorted({(m["batch"], m["context"]) for m in decode}):
        row = {(m["engine"], bool(m.get("cuda_graphs"))): m for m in decode if (m["batch"], m["context"]) == (b, c)}
        roof = next(iter(row.values()))["roofline_hbm_s"]
        cells = " ".join(f"{row[k]['step_s'] * 1e3:12.3f} ({row[k]['x_roofline']:5.1f}x)" if k in row else f"{'-':>22s}"
                         for k in names)
        lines.append(f"{b:5d} {c:7d} {roof * 1e3:11.3f} {cells}")
    for m in (m for m in ms if m.get("kind") == "burst"):
        lines.append(f"burst ({'graphs' if m['cuda_graphs'] else 'eager'}): {m['case']}: "
                     f"{m['output_tokens_per_s']:.0f} output tok/s, bound {m['bound_output_tokens_per_s']:.0f} "
                     f"({m['x_bound']:.1f}x the bound's time), {m['steps']} steps")
    first_calls = [m for m in ms if m.get("kind") == "prefill_first_call_summary"]
    if first_calls:
        lines += ["", "prefill steps on new prompt shapes: median ms of the first call and of repeats"]
        for m in first_calls:
            lines.append(f"  {m['form']:9s} cuDNN attention {'allowed ' if m['allow_cudnn'] else 'excluded'}: first "
                         f"{m['first_median_s'] * 1e3:8.2f}, repeat {m['repeat_median_s'] * 1e3:8.2f} "
                         f"({m['first_over_repeat']:.2f}x, {m['shapes']} shapes)")
    for m in (m for m in ms if m.get("kind") == "sdpa_choice"):
        lines.append(f"  SDPA kernel, {m['form']}: torch default {m['torch default']}, engine {m['engine (no cuDNN)']}")
    verdicts = [m for m in ms if m.get("kind") == "fidelity"]
    head = (f"{'load':16s} {'req/s':>7s} {'policy':16s} {'vs':9s} {'TTFT p50':>9s} {'TTFT p90':>9s} {'TPOT p50':>9s} "
            f"{'TPOT p90':>9s} {'step med':>9s} {'(unseen)':>9s} {'prompt t':>8s} {'(error)':>8s} {'target':>7s}  verdict")
    lines += ["", "fidelity summary: (predicted - measured) / measured; step med = median |error| of the real "
              "run's steps, unseen = on shapes not in the profile; prompt t = the share of the run's time in prefill and mixed steps "
              "(error = of their summed time)", head, "-" * len(head)]
    for v in verdicts:
        cells = " ".join(f"{_fmt(e, signed=True):>9s}" for e in v["errors"].values())
        lines.append(f"{v['rate']:16s} {v['rate_req_s']:7.3g} {v['policy']:16s} {v['against']:9s} {cells} "
                     f"{_fmt(v['step_median_abs']):>9s} {_fmt(v['step_median_abs_unseen']):>9s} "
                     f"{_fmt(v.get('prompt_time_share')):>8s} {_fmt(v.get('prompt_time_error'), signed=True):>8s} "
                     f"{v['target']:>7.0%}  "
                     f"{v['verdict']}")
    for run in summary["runs"]:
        if not run.get("report"):
            lines.append(f"{run['rate_name']:16s} {run['rate']:7.3g} (not run: {run.get('skipped') or 'failed'})")
    for name, info in summary["stages"].items():
        state = "ok" if info["ok"] else ("skipped: " + info["skipped"] if info.get("skipped")
                                         else "FAILED: " + info.get("error", ""))
        lines.append(f"stage {name}: {state} ({info.get('seconds', 0)} s)")
    return "\n".join(lines), verdicts


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
