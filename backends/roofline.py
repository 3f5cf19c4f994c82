"""Roofline step cost: each op group takes max(compute time, memory time) on one accelerator.

Sources for the arithmetic: Williams, Waterman & Patterson, "Roofline: an insightful visual
performance model" (CACM 2009) for max(FLOPs/peak, bytes/bandwidth); Kaplan et al., "Scaling
laws for neural language models" (2020, table 1) for 2 FLOPs per parameter per token and the
attention term; Shoeybi et al., "Megatron-LM" (2019) for two all-reduces per layer under tensor
parallelism; the NCCL performance notes for the ring all-reduce factor 2(tp-1)/tp.

One step processes T positions. Op groups, per GPU (everything divides by tp):
  dense:     FLOPs = 2 T (linear params of all layers) + 2 S V h    (S = seqs whose logits select)
             bytes = weights once per step (lm_head only when S > 0) + activation traffic
  attention: FLOPs = 4 H_Q d L sum_i q_i (c_i + q_i / 2)          (causal: half the new square)
             bytes = KV read sum_i c_i + KV written sum_i q_i, at kv bytes per position
  comm:      per all-reduce (2 per layer) 2(tp-1)/tp T h s / link bandwidth + latency
  overhead:  step_overhead_s + per_seq_overhead_s x seqs
Host<->device swaps in the plan cost latency + blocks x block_bytes / link bandwidth per
direction, added to the step (`serial`) or hidden under it (`overlap`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from backends.base import CostContext
from simcore.capacity import kv_heads_per_gpu
from simcore.errors import ConfigError
from simcore.model import ModelSpec
from simcore.plan import Repeat, StepPlan
from simcore.presets import GB, HardwareSpec, get_link

TRANSFER_MODES = ("serial", "overlap")

# Fields taken from the run (CostContext), not from the user's cost_model parameters.
CONTEXT_FIELDS = ("model", "hardware", "weight_dtype_bytes", "kv_dtype_bytes", "tensor_parallel")

_DEFAULT_TRANSFER_LATENCY_S = 10e-6
# Steps from which a repeat is priced in numpy arrays rather than a step at a time: below it
# numpy's fixed cost per call is the larger (measured: 21 us for any repeat under ~20 steps,
# about 1 us a step the other way).
MIN_STEPS_IN_ARRAYS = 32


@dataclass(frozen=True)
class RooflineCostModel:
    model: ModelSpec
    hardware: HardwareSpec
    # Bytes per weight and per activation scalar (the compute dtype), and per stored KV scalar.
    weight_dtype_bytes: int = 2
    kv_dtype_bytes: int = 2
    tensor_parallel: int = 1
    # --- Tunable parameters: plain numbers and names, so a YAML or calibration file can set them.
    # Fraction of peak FLOP/s achieved by GEMMs and attention (H200: 750/989 measured for 8192^3).
    mfu: float = 0.6
    # Fraction of memory bandwidth achieved by weight and KV streaming.
    mbu: float = 0.8
    # Fixed cost of every forward pass: scheduling, input preparation, launches or graph replay.
    step_overhead_s: float = 5e-4
    # Extra cost per scheduled sequence (block tables, sampling), seconds.
    per_seq_overhead_s: float = 0.0
    # Hidden-width activation tensors read or written per layer per position. A fused Llama layer
    # moves about 24: norms and residual adds ~8, q/k/v and attention output ~6, o-proj ~2, and
    # the MLP's gate/up/SiLU/down intermediates ~2 I/h (I/h is 2.7-5 in the presets).
    activation_rw_per_layer: float = 24.0
    # All-reduces per layer under tensor parallelism (after attention and after the MLP).
    allreduce_per_layer: int = 2
    # Host link for swaps: a preset name, or a speed in GB/s (1e9 bytes/s, not gigabits).
    # Neither: the hardware's own host link preset.
    link: str | None = None
    link_gbps: float | None = None
    # Fixed cost of one batched copy per direction; None: the link preset's latency.
    transfer_latency_s: float | None = None
    # `serial`: swaps add to the step; `overlap`: they run beside compute, max(compute, transfer).
    transfer_mode: str = "serial"

    def __post_init__(self) -> None:
        self._validate()
        m, tp = self.model, self.tensor_parallel
        h, num_layers = m.hidden_size, m.num_layers
        q_width, kv_width = m.num_q_heads * m.head_dim, m.num_kv_heads * m.head_dim
        # q, k, v, o projections and the three SwiGLU matrices; biases are too small to count.
        linear_per_layer = h * q_width + 2 * h * kv_width + q_width * h + 3 * h * m.intermediate_size
        embed = m.vocab_size * h
        non_embedding = m.num_params - embed - (0 if m.tie_word_embeddings else embed)
        wb = self.weight_dtype_bytes
        link_rate, link_latency = self._link()
        consts = {
            "_gemm_flops_per_token": 2.0 * num_layers * linear_per_layer / tp,
            "_lm_head_flops_per_select": 2.0 * embed / tp,
            "_weight_bytes_no_head": non_embedding * wb / tp,
            # A tied lm_head is the embedding matrix, still read in full for the logits.
            "_weight_bytes_with_head": (non_embedding + embed) * wb / tp,
            # Activation traffic plus the embedding row gathered for each position.
            "_act_bytes_per_token": (self.activation_rw_per_layer * num_layers * h * wb + h * wb) / tp,
            # 4 q (c + q/2) = 2 q (2c + q): step_time sums the integer q (2c + q) exactly.
            "_attn_flops_per_work": 2.0 * m.num_q_heads * m.head_dim * num_layers / tp,
            "_kv_bytes_per_pos": float(
                2 * num_layers * kv_heads_per_gpu(m, tp) * m.head_dim * self.kv_dtype_bytes),
            "_compute_rate": self.hardware.peak_flops * self.mfu,
            "_mem_rate": self.hardware.mem_bandwidth * self.mbu,
            "_comm_per_token": 0.0,
            "_comm_fixed": 0.0,
            "_link_rate": link_rate,
            "_link_latency": link_latency,
            "_overlap": self.transfer_mode == "overlap",
        }
        if tp > 1:
            num_allreduce = self.allreduce_per_layer * num_layers
            ring = 2.0 * (tp - 1) / tp
            consts["_comm_per_token"] = num_allreduce * ring * h * wb / self.hardware.interconnect_bandwidth
            consts["_comm_fixed"] = num_allreduce * self.hardware.interconnect_latency_s
        for name, value in consts.items():
            object.__setattr__(self, name, value)

    # --- the contract -------------------------------------------------------------------------

    def step_time(self, plan: StepPlan) -> float:
        """Seconds for this step: compute (if any sequence runs) and host<->device transfers."""
        transfer = self.transfer_time(plan)
        if not plan.num_seqs:
            return transfer
        num_tokens, num_selecting, sum_context, attn_work, _ = _sums(plan)
        dense, comm, overhead = self._fixed_parts(num_tokens, plan.num_seqs, num_selecting)
        compute = dense + self._attention_time(attn_work, sum_context + num_tokens) + comm + overhead
        if self._overlap:
            return max(compute, transfer)
        return compute + transfer

    def repeat_times(self, repeat: Repeat) -> np.ndarray | list[float]:
        """Times of a repeat's steps, bit-equal to step_time on each step's plan: the same sums,
        advanced in integers (step j adds j q_i to each context: j T to the context total and
        2 j q_i^2 to the attention work q (2c + q)), then the same float operations, a step an
        element (numpy's float64 arithmetic is the same IEEE arithmetic, in the same order)."""
        plan = repeat.kept_plan()
        num_tokens, num_selecting, sum_context, attn_work, sum_squares = _sums(plan)
        dense, comm, overhead = self._fixed_parts(num_tokens, plan.num_seqs, num_selecting)
        # (No transfers: a repeat's plan moves no blocks; x + 0.0 and max(x, 0.0) are x.)
        steps = range(repeat.advance, repeat.advance + repeat.num_steps)
        if repeat.num_steps < MIN_STEPS_IN_ARRAYS:
            return [dense + self._attention_time(attn_work + 2 * sum_squares * step,
                                                 sum_context + num_tokens * step + num_tokens) + comm + overhead
                    for step in steps]
        steps = np.arange(steps.start, steps.stop, dtype=np.int64)
        attention = self._attention_time(attn_work + 2 * sum_squares * steps, sum_context + num_tokens * steps + num_tokens)
        return dense + attention + comm + overhead

    def _attention_time(self, attn_work: Any, kv_positions: Any) -> Any:
        """Attention's roofline: FLOPs 2 H_Q d L sum q (2c + q) against KV bytes read and written
        (of one step, or of steps given as integer arrays)."""
        compute = attn_work * self._attn_flops_per_work / self._compute_rate
        memory = kv_positions * self._kv_bytes_per_pos / self._mem_rate
        return np.maximum(compute, memory) if isinstance(compute, np.ndarray) else max(compute, memory)

    def _fixed_parts(self, num_tokens: int, num_seqs: int, num_selecting: int) -> tuple[float, float, float]:
        """The dense, comm and overhead terms (they do not depend on context)."""
        weight_bytes = self._weight_bytes_with_head if num_selecting else self._weight_bytes_no_head
        dense_flops = num_tokens * self._gemm_flops_per_token + num_selecting * self._lm_head_flops_per_select
        dense_bytes = weight_bytes + num_tokens * self._act_bytes_per_token
        dense = max(dense_flops / self._compute_rate, dense_bytes / self._mem_rate)
        comm = num_tokens * self._comm_per_token + self._comm_fixed
        overhead = self.step_overhead_s + num_seqs * self.per_seq_overhead_s
        return dense, comm, overhead

    def transfer_time(self, plan: StepPlan) -> float:
        """Swap-in plus swap-out: per direction one latency and blocks x block bytes / link rate."""
        total = 0.0
        for num_blocks in (len(plan.blocks_to_swap_in), len(plan.blocks_to_swap_out)):
            if num_blocks:
                total += self._link_latency + num_blocks * plan.block_bytes / self._link_rate
        return total

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        """The step's time by part (for reports and tests); their total is step_time's compute."""
        num_tokens, num_selecting, sum_context, attn_work, _ = _sums(plan)
        dense, comm, overhead = self._fixed_parts(num_tokens, plan.num_seqs, num_selecting)
        return {"dense_s": dense, "attention_s": self._attention_time(attn_work, sum_context + num_tokens),
                "comm_s": comm, "overhead_s": overhead, "transfer_s": self.transfer_time(plan)}

    # --- checks -----------------------------------------------------------------------------------

    def _link(self) -> tuple[float, float]:
        if self.link_gbps is not None:
            rate = self.link_gbps * GB
            latency = _DEFAULT_TRANSFER_LATENCY_S
        else:
            spec = get_link(self.link if self.link is not None else self.hardware.host_link)
            rate, latency = spec.bytes_per_s, spec.latency_s
        if self.transfer_latency_s is not None:
            latency = self.transfer_latency_s
        return float(rate), float(latency)

    def _validate(self) -> None:
        _check_number("mfu", self.mfu, upper=1.0)
        _check_number("mbu", self.mbu, upper=1.0)
        _check_number("step_overhead_s", self.step_overhead_s, allow_zero=True)
        _check_number("per_seq_overhead_s", self.per_seq_overhead_s, allow_zero=True)
        _check_number("activation_rw_per_layer", self.activation_rw_per_layer, allow_zero=True)
        _check_int("allreduce_per_layer", self.allreduce_per_layer, minimum=0)
        _check_int("tensor_parallel", self.tensor_parallel, minimum=1)
        _check_int("weight_dtype_bytes", self.weight_dtype_bytes, minimum=1)
        _check_int("kv_dtype_bytes", self.kv_dtype_bytes, minimum=1)
        if self.link is not None and self.link_gbps is not None:
            raise ValueError("link and link_gbps: give one host link, not both")
        if self.link is not None and not isinstance(self.link, str):
            raise ValueError(f"link: expected a host link preset name, found {self.link!r}")
        if self.link_gbps is not None:
            _check_number("link_gbps", self.link_gbps)
        if self.transfer_latency_s is not None:
            _check_number("transfer_latency_s", self.transfer_latency_s, allow_zero=True)
        if self.transfer_mode not in TRANSFER_MODES:
            raise ValueError(f"transfer_mode: expected one of {list(TRANSFER_MODES)}, found {self.transfer_mode!r}")


def _sums(plan: StepPlan) -> tuple[int, int, int, int, int]:
    """A plan's positions processed, how many select, its context total, attention work
    sum q (2c + q) and sum q^2 (integers: exact)."""
    contexts = plan.decodes.context_lens
    # Decodes as columns: q = 1 each, all selecting.
    num_tokens = num_selecting = sum_squares = len(contexts)
    sum_context = sum(contexts)
    attn_work = 2 * sum_context + num_tokens
    for seq in plan.listed:
        q, c = seq.num_new_tokens, seq.context_len
        num_tokens += q
        sum_context += c
        attn_work += q * (2 * c + q)
        sum_squares += q * q
        if seq.selects_token:
            num_selecting += 1
    return num_tokens, num_selecting, sum_context, attn_work, sum_squares


def _check_number(name: str, value: Any, *, upper: float | None = None, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value >= 0 if allow_zero else value > 0) and (upper is None or value <= upper)
    if not ok:
        low = "[0" if allow_zero else "(0"
        high = f"{upper:g}]" if upper is not None else "inf)"
        raise ValueError(f"{name}: expected a number in {low}, {high}, found {value!r}")


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, found {value!r}")


def tunable_names() -> list[str]:
    """The parameter names a cost_model section may set for the roofline."""
    return [f.name for f in dataclasses.fields(RooflineCostModel) if f.name not in CONTEXT_FIELDS]


def make_roofline(params: dict, ctx: CostContext) -> RooflineCostModel:
    """Build from a run's context and the user's (or a calibration file's) parameter mapping."""
    from simcore.presets import get_hardware

    source = str(ctx.source) if ctx.source is not None else None
    names = [*tunable_names(), "calibration"]
    for key in params:
        if key not in names:
            raise ConfigError("unknown roofline parameter", source=source, where=f"cost_model.{key}",
                              expected=f"one of {names}", found=str(key), choices=names)
    if "calibration" in params:
        # A file from `servesim calibrate`; parameters given beside it override the file's.
        from backends.calibration import load_calibration, resolve_calibration_path

        params = dict(params)
        path = resolve_calibration_path(params.pop("calibration"), ctx.source, "cost_model.calibration")
        params = {**load_calibration(path, hardware=ctx.hardware_name, source=source), **params}
    hardware = get_hardware(ctx.hardware_name, source=ctx.source)
    try:
        return RooflineCostModel(
            model=ctx.model, hardware=hardware, weight_dtype_bytes=ctx.weight_dtype_bytes,
            kv_dtype_bytes=ctx.kv_dtype_bytes, tensor_parallel=ctx.tensor_parallel, **params,
        )
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc), source=source, where="cost_model") from None
    except ConfigError as exc:
        if exc.source is not None:
            raise
        raise ConfigError(str(exc), source=source, where="cost_model") from None
