"""`make_torch(params, ctx)`: build the real engine a simulation times its steps with.

Parameters (the `cost_model` mapping of an experiment file):
  device: cpu | cuda | cuda:N      default cuda when available, else cpu
  dtype: bf16 | fp16 | fp32        default bf16 on cuda, fp32 on cpu
  weights: path                    local HF checkpoint dir (relative to the experiment file); random if absent
  sampling: {temperature, top_p}   default greedy
  attention: auto | portable | triton | flex
  cuda_graphs: bool                capture decode-only steps (CUDA, triton attention)
  record_tokens: bool              keep a (step, request, token) log on the cost model; the runner
                                   adds each request's output_token_ids to requests.parquet
  warmup_rounds: int               throwaway warm-up rounds at construction (default 2)
The pool holds ctx.num_blocks blocks of ctx.block_size positions (+ ctx.num_host_blocks on the host).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from backends.base import CostContext
from backends.torch.attention import resolve_backend
from backends.torch.cost_model import TorchCostModel
from backends.torch.engine import PagedEngine
from backends.torch.host_memory import move_weights_to_huge_pages
from backends.torch.kv_pool import KVPool
from backends.torch.model import LlamaModel
from backends.torch.sampling import SamplingParams
from backends.torch.support import check_engine_supports
from backends.torch.weights import load_checkpoint
from simcore.errors import ConfigError, ServesimError
from simcore.model import ModelSpec
from simcore.paths import path_beside

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}


@dataclass
class TorchParams:
    device: str | None = None
    dtype: str | None = None
    weights: str | None = None
    sampling: dict = field(default_factory=dict)
    attention: str = "auto"
    cuda_graphs: bool = False
    cuda_graph_max_batch: int = 256
    record_tokens: bool = False
    warmup_rounds: int = 2


def resolve_device(name: str | None, *, source: object = None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError("unknown device", source=source, where="cost_model.device",
                          expected="cpu, cuda or cuda:N", found=name) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ServesimError(
            f"device {name!r} was requested but CUDA is not available to torch {torch.__version__} "
            "(CPU-only build or no visible GPU); use device: cpu"
        )
    if device.type not in ("cpu", "cuda"):
        raise ConfigError("unsupported device", source=source, where="cost_model.device",
                          expected="cpu, cuda or cuda:N", found=name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_dtype(name: str | None, device: torch.device, *, source: object = None) -> torch.dtype:
    if name is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ConfigError("unknown dtype", source=source, where="cost_model.dtype",
                          expected="bf16, fp16 or fp32", found=name, choices=DTYPES)
    return DTYPES[name]


def sampling_params(raw: dict, *, source: object = None) -> SamplingParams:
    from simcore.validate import build_model_from_params

    params = build_model_from_params(SamplingParams, dict(raw or {}), where="cost_model.sampling", source=source)
    if params.temperature < 0 or not 0 < params.top_p <= 1:
        raise ConfigError("temperature must be >= 0 and top_p in (0, 1]", source=source,
                          where="cost_model.sampling", found=f"{params}")
    return params


def describe(spec: ModelSpec, dtype: torch.dtype, num_blocks: int, block_size: int, device: torch.device) -> str:
    kv_bytes = spec.kv_bytes_per_token(torch.finfo(dtype).bits // 8) * num_blocks * block_size
    weight_bytes = spec.num_params * (torch.finfo(dtype).bits // 8)
    return (f"model {spec.name!r} ({weight_bytes / 2**30:.2f} GiB weights, dtype {str(dtype).removeprefix('torch.')}) "
            f"with num_blocks={num_blocks} x block_size={block_size} ({kv_bytes / 2**30:.2f} GiB KV) on {device}")


def build_engine(
    spec: ModelSpec, *, device: torch.device, dtype: torch.dtype, num_blocks: int, block_size: int,
    num_host_blocks: int = 0, seed: int = 0, weights: str | Path | None = None, attention: str = "auto",
    sampling: SamplingParams | None = None, source: object = None,
) -> PagedEngine:
    """Model (random or loaded), KV pool and decode backend, wired into a PagedEngine."""
    check_engine_supports(spec, source=source)  # MoE, MLA, attention sinks: refused by name
    max_blocks = min(num_blocks, -(-spec.max_position_embeddings // block_size))
    backend = resolve_backend(attention, device, source=source, max_blocks_per_seq=max_blocks, spec=spec)
    model = LlamaModel(spec, device=device, dtype=dtype)
    if weights is None:
        model.init_random(seed)
    else:
        load_checkpoint(model, weights)
    model.eval()
    if device.type == "cpu":
        move_weights_to_huge_pages(model)  # a CPU step streams every weight: fewer TLB misses
    pool = KVPool(num_layers=spec.num_layers, num_blocks=num_blocks, block_size=block_size,
                  num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, dtype=dtype, device=device,
                  num_host_blocks=num_host_blocks)
    return PagedEngine(model, pool, backend, sampling=sampling, seed=seed)


def make_torch(params: dict, ctx: CostContext) -> TorchCostModel:
    from simcore.validate import build_model_from_params

    source = str(ctx.source) if ctx.source else None
    p = build_model_from_params(TorchParams, dict(params or {}), where="cost_model", source=source)
    device = resolve_device(p.device, source=source)
    dtype = resolve_dtype(p.dtype, device, source=source)
    if ctx.num_blocks <= 0:
        raise ConfigError("the torch cost model needs a KV pool size (num_blocks > 0)", source=source,
                          where="cost_model", found=ctx.num_blocks)
    if p.cuda_graphs and device.type != "cuda":
        raise ConfigError("cuda_graphs needs device cuda", source=source, where="cost_model.cuda_graphs")
    weights = None
    if p.weights:
        weights = path_beside(p.weights, ctx.source)
    what = describe(ctx.model, dtype, ctx.num_blocks, ctx.block_size, device)
    try:
        engine = build_engine(
            ctx.model, device=device, dtype=dtype, num_blocks=ctx.num_blocks, block_size=ctx.block_size,
            num_host_blocks=ctx.num_host_blocks, seed=ctx.seed, weights=weights, attention=p.attention,
            sampling=sampling_params(p.sampling, source=source), source=source,
        )
        engine.warmup(p.warmup_rounds)
        if p.cuda_graphs:
            if engine.decode_backend.name != "triton":
                raise ConfigError("cuda_graphs needs attention 'triton' (or 'auto' with triton installed)",
                                  source=source, where="cost_model.cuda_graphs")
            from backends.torch.cuda_graphs import DecodeGraphs

            graphs = DecodeGraphs(engine.model, engine.pool, max_batch=p.cuda_graph_max_batch)
            graphs.capture()
            engine.graphs = graphs
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if not _is_oom(exc):
            raise
        raise ServesimError(f"out of device memory building the torch engine: {what}; "
                            "lower num_blocks (or gpu memory utilization) or use a smaller model/dtype") from None
    return TorchCostModel(engine, record_tokens=p.record_tokens, describe=what)


def _is_oom(exc: BaseException) -> bool:
    # CUDA raises OutOfMemoryError; the CPU allocator raises a plain RuntimeError.
    return isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in str(exc)
