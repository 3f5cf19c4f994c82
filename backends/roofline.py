"""Roofline step cost: each op group takes max(compute time, memory time) on one accelerator.

Sources for the arithmetic: Williams, Waterman & Patterson, "Roofline: an insightful visual
performance model" (CACM 2009) for max(FLOPs/peak, bytes/bandwidth); Kaplan et al., "Scaling
laws for neural language models" (2020, table 1) for 2 FLOPs per parameter per token and the
attention term; Shoeybi et al., "Megatron-LM" (2019) for two all-reduces per layer under tensor
parallelism; the NCCL performance notes for the ring all-reduce factor 2(tp-1)/tp.

One step processes T positions. Op groups, per GPU (everything divides by tp, but under
attention data parallelism the non-expert weights, read whole by every GPU):
  dense:     FLOPs = 2 T (linear params of all layers) + 2 S V h    (S = seqs whose logits select)
             bytes = weights once per step (lm_head only when S > 0) + activation traffic
             MoE: linear params are the active ones (router, top-k and shared experts); the
             routed experts are kernels of their own, max(FLOPs, bytes) apart, plus a fixed time
             per MoE layer: their FLOPs counted per row of their grouped GEMM, each expert's n
             tokens padded to whole tiles of m rows, E m E[ceil(n / m)] rows, n ~ Binomial(T, k/E),
             at the GEMM rate times I / (I + 512 x peak / bf16 peak) for experts of width I
             (times 0.57 more where the kernel widens their weights); of the routed
             experts a step reads E (1 - (1 - k/E)^T) per layer (uniform routing), at the
             experts' own bytes where the checkpoint stores them apart (gpt-oss: MXFP4)
             plus L x kernels_per_layer kernel floors (the hardware's kernel_floor_us), paid
             whatever the batch and the parallelism
  attention: FLOPs = 4 H_Q d L sum_i q_i (c_i + q_i / 2)          (causal: half the new square)
             bytes = KV read sum_i c_i + KV written sum_i q_i, at kv bytes per position (times
             the query heads per KV head for a kernel that reads KV once per query head)
             MLA: per head and pair 2 kv_lora_rank + qk_rope (absorbed form), a latent per position
  comm:      per all-reduce (2 per layer), a ring over the collective link:
             base + 2(tp-1) hop latencies + 2(tp-1)/tp T h a / the link's measured
             all-reduce bus bandwidth
             (a = activation stream bytes: the activation dtype's, never under bf16's 2, as
             GEMMs write bf16); pipeline parallelism adds (pp-1) sends of T h a bytes; attention
             data parallelism has none but an all-to-all each way per MoE layer
  GEMMs run at the tensor-core peak of the activation dtype (fp8 W8A8 at the fp8 peak; 4-bit
  weight-only at the bf16 peak), falling back to the next wider peak the part has
  (simcore.precision), at mfu times what that peak's GEMMs reach against bf16's
  (peak_efficiency); attention at the bf16 peak.
  overhead:  step_overhead_s + per_seq_overhead_s x seqs, added to the rest, or with
             async_scheduling overlapping it: max(rest, overhead); none on a multi-step group's
             later steps
Host<->device swaps in the plan cost latency + blocks x block_bytes / link bandwidth per
direction, added to the step (`serial`) or hidden under it (`overlap`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from backends.base import CostContext
from simcore.capacity import kv_heads_per_gpu
from simcore.errors import ConfigError
from simcore.hardware import mesh_bandwidth
from simcore.model import ModelSpec
from simcore.plan import Repeat, StepPlan
from simcore.precision import ACTIVATION_DTYPE_BYTES, PEAK_DTYPES, PEAK_EFFICIENCY
from simcore.presets import GB, HardwareSpec, get_link

TRANSFER_MODES = ("serial", "overlap")
ATTENTION_KV_READS = ("per_kv_head", "per_query_head")
# Grouped MoE GEMMs that widen their weights in the kernel, against the width rule (see
# moe_gemm_efficiency): 0.49 measured over 0.85 given by the rule at gpt-oss's width.
DEQUANTIZED_MOE_GEMM_EFFICIENCY = 0.57

# Fields taken from the run (CostContext), not from the user's cost_model parameters.
CONTEXT_FIELDS = ("model", "hardware", "weight_dtype_bytes", "kv_dtype_bytes", "tensor_parallel", "activation_dtype",
                  "pipeline_parallel", "expert_weight_dtype_bytes", "attention_data_parallel")

_DEFAULT_TRANSFER_LATENCY_S = 10e-6
# Steps from which a repeat is priced in numpy arrays rather than a step at a time: below it
# numpy's fixed cost per call is the larger (measured: 21 us for any repeat under ~20 steps,
# about 1 us a step the other way).
MIN_STEPS_IN_ARRAYS = 32


class StepUnits(NamedTuple):
    """A step's work per unit, as the roofline prices it (`RooflineCostModel.step_units`)."""

    # Weights read by a step (on one GPU), without and with the LM head (a step that selects).
    weight_bytes_no_head: float
    weight_bytes_with_head: float
    # GEMM FLOPs per row run, and the LM head's per row that selects.
    gemm_flops_per_token: float
    lm_head_flops_per_select: float
    # Activation bytes per row run.
    act_bytes_per_token: float
    # Attention FLOPs per unit of work q (2c + q), and KV bytes per position read or written.
    attn_flops_per_work: float
    kv_bytes_per_pos: float
    # Collective seconds per row run, and per step.
    comm_per_token: float
    comm_fixed: float
    # Kernels' fixed seconds per step.
    kernel_floors: float


@dataclass(frozen=True)
class RooflineCostModel:
    model: ModelSpec
    hardware: HardwareSpec
    # Bytes per stored weight (0.5 for 4-bit formats) and per stored KV scalar.
    weight_dtype_bytes: float = 2
    kv_dtype_bytes: int = 2
    tensor_parallel: int = 1
    # The GEMMs' compute dtype: its peak prices dense FLOPs, its bytes the activation traffic and
    # collective payloads (simcore.precision).
    activation_dtype: str = "bf16"
    # Pipeline stages: a step runs through all of them in turn (one batch in flight).
    pipeline_parallel: int = 1
    # Bytes per stored routed-expert weight where a checkpoint quantizes the experts apart
    # (gpt-oss: MXFP4, 4.25 bits); None: weight_dtype_bytes.
    expert_weight_dtype_bytes: float | None = None
    # Attention data parallel over the tensor_parallel GPUs, with the routed experts spread over
    # them (expert parallelism; "DEP"): each GPU runs a 1/tp share of the batch through attention
    # and the non-expert layers with all their weights and every KV head, and each MoE layer
    # sends its tokens to their experts' GPUs and back (an all-to-all each way).
    attention_data_parallel: bool = False
    # --- Tunable parameters: plain numbers and names, so a YAML or calibration file can set them.
    # Fraction of the bf16 peak achieved by bf16 GEMMs and attention (H200: 750/989 measured for
    # an 8192^3 bf16 GEMM; bf16 GEMMs of 2048-8192 rows reach 0.77-0.80 of an H100's, measured by
    # aiconfigurator). 0.7 and the step overhead below are fitted to the `fit` figures of
    # benchmarks/published once kernel floors and measured all-reduce bandwidths were in (before:
    # 0.65 and 2.5 ms; 0.5 with every peak at the same share; before that 0.6 and 5e-4).
    mfu: float = 0.7
    # Of that share, what a GEMM on a narrower peak reaches (peak name -> factor: fp8 0.75, fp4 0.56
    # by default, simcore.precision.PEAK_EFFICIENCY); {fp8: 1, int8: 1, fp4: 1} gives every peak mfu.
    peak_efficiency: dict[str, float] | None = None
    # Fraction of memory bandwidth achieved by weight and KV streaming.
    mbu: float = 0.8
    # Fixed cost of every forward pass: scheduling, input preparation, launches or graph replay.
    step_overhead_s: float = 2e-3
    # Kernels a layer runs, in units of the hardware's kernel_floor_us (a small GEMM's fixed
    # time), each of which a step pays whatever its batch: a dense layer's 4 GEMMs (q/k/v,
    # output, gate/up, down), attention at about twice a GEMM's floor (5.5-8 us measured for
    # decode attention at batch 1 on an H100: aiconfigurator's TensorRT-LLM 1.3 and vLLM 0.19
    # generation_attention), and norms, rotary and activation at about a third each: 7. The
    # floors add to the layer's roofline time (GEMM time is the floor plus the larger of its
    # FLOPs and bytes, across the measured sizes); every GPU pays all its layers' floors
    # whatever the parallelism, which is why they weigh most on tensor-parallel steps.
    kernels_per_layer: float = 7.0
    # Extra cost per scheduled sequence (block tables, sampling), seconds.
    per_seq_overhead_s: float = 0.0
    # The scheduler prepares each step while the device runs the one before (vLLM's
    # --async-scheduling, SGLang's overlap scheduler): the overheads above overlap the device's
    # work instead of adding to it.
    async_scheduling: bool = False
    # Hidden-width activation tensors read or written per layer per position. A fused Llama layer
    # moves about 24: norms and residual adds ~8, q/k/v and attention output ~6, o-proj ~2, and
    # the MLP's gate/up/SiLU/down intermediates ~2 I/h (I/h is 2.7-5 in the presets).
    activation_rw_per_layer: float = 24.0
    # Bytes per scalar of the hidden-width activations between GEMMs (residual stream, norm
    # outputs, MLP intermediates) and of the collectives' payloads. None: the activation dtype's
    # bytes but never under bf16's 2. W8A8 and W4A4 engines cast only each GEMM's input to 8 or
    # 4 bits (the cast fused into the norm before it); the GEMM writes its fp32 accumulator out
    # as bf16, and the residual adds and all-reduces run on those bf16 outputs (vLLM's fp8
    # schemes, TensorRT-LLM's fp8 and NVFP4 recipes). Before: the activation dtype's bytes (1 for
    # fp8).
    activation_stream_bytes: float | None = None
    # Rows of one tile of the grouped GEMM that runs the routed experts: each expert's tokens are
    # padded to whole tiles (moe_expert_tile_rows). None: the tile the Triton MoE kernels pick
    # from the mean tokens per expert t = T k / E (triton_kernels matmul_ogs, NVIDIA opt_flags:
    # next power of two of 2t within [16, 64] for t <= 64, of t within [16, 128] above), with E the
    # experts on one GPU under attention data parallelism (E / tp: expert_tile_rows); a number
    # fixes it; 1 prices the experts' rows unpadded, as before.
    moe_tile_rows: int | None = None
    # How decode attention reads the KV cache: each KV head once for the query heads that share
    # it ("per_kv_head": FlashAttention, FlashInfer, TensorRT-LLM's XQA), or once per query head
    # ("per_query_head": a multi-head kernel run on a grouped-query model, as TensorRT-LLM's
    # masked MHA before XQA, which its XQA blog says came in v0.8 with up to 2.4x Llama-70B
    # throughput): KV bytes times the query heads per KV head. MLA's latent is read once.
    attention_kv_reads: str = "per_kv_head"
    # The routed experts' grouped GEMMs run apart from the rest, bound by their own FLOPs or weight
    # reads, at this fraction of the dense GEMMs' compute rate. None: by the experts' width and
    # dtype, I / (I + moe_half_rate_width x the compute peak over the bf16 peak) for experts of
    # intermediate size I (each expert's tiles are small GEMMs with a fixed cost apiece, against
    # compute that shrinks as the peak grows), times 0.57 where the experts are widened inside
    # the kernel (stored narrower than the compute dtype on a part without fp4 tensor cores:
    # gpt-oss's MXFP4 x bf16 on Hopper). Both from NVIDIA's aiconfigurator measurements of
    # TensorRT-LLM 1.3.0rc20's MoE against its dense GEMMs at 8192+ tokens (ai-dynamo/aiconfigurator
    # at 095f58a5, systems/data/{h200,b200}_sxm/{moe,gemm}/trtllm/1.3.0rc20, CUTLASS backend): the
    # MoE rate over the dense one grows with I, from 0.50 (bf16) and 0.37 (fp8) on an H200 and
    # 0.13 (nvfp4) on a B200 at I = 512 to 0.8-1 at 2048-14336 for bf16 and fp8 and 0.66 at 2048
    # for nvfp4; Triton's MXFP4 x bf16 MoE on an H200 reaches 0.49 at gpt-oss's I = 2880, where
    # the width rule gives 0.85 (Triton's own note: 37-49% of peak, triton-lang/triton PR 6833).
    moe_gemm_efficiency: float | None = None
    # The expert width at which bf16 grouped GEMMs reach half the dense rate (see above).
    moe_half_rate_width: float = 512.0
    # Fixed time of each MoE layer a step runs (routing, top-k, token permute and unpermute, the
    # grouped GEMMs' launches), microseconds: an MoE layer's time at one token less its weight
    # reads, measured 68 and 65 (H200, Triton MXFP4, gpt-oss-120b/20b shapes), 53 and 17 (B200,
    # CUTLASS and trtllm-gen NVFP4, Qwen3-30B-A3B shape; all aiconfigurator, as above) and 26
    # (H100, vLLM's fused_moe in bf16, gpt-oss-120b shape, vllm-project/vllm PR 39902): 50.
    moe_layer_overhead_us: float = 50.0
    # Batch sizes the engine captured CUDA graphs for, with padding (TensorRT-LLM's
    # cuda_graph_config {enable_padding: true, batch_sizes: [...]}): a decode-only step of n
    # sequences (per GPU under attention data parallelism) replays the graph of the smallest
    # captured size >= n, its n real requests padded with dummy ones that run every GEMM, the
    # routed experts and the collectives as real rows (their attention, over a context of about
    # one position, is left out). A step with a prompt piece, or a batch above the largest size,
    # runs eager and unpadded. None: no padding.
    cuda_graph_batch_sizes: list[int] | None = None
    # All-reduces per layer under tensor parallelism (after attention and after the MLP).
    allreduce_per_layer: int = 2
    # The link collectives run over: a link preset name (`servesim hardware` lists them), or
    # bandwidth and per-hop latency given here; unset parts come from the hardware's interconnect.
    collective_link: str | None = None
    collective_bandwidth_gb_s: float | None = None
    collective_latency_us: float | None = None
    # Fixed cost of every collective besides its hops (launch, synchronisation), microseconds:
    # NCCL's own base latency of a ring all-reduce, LL protocol (src/graph/tuning.cc, baseLat).
    collective_base_latency_us: float = 6.6
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
        embed = m.vocab_size * h
        # The geometry is ModelSpec's (dense, MoE, MLA alike), and so is which weights a step
        # reads (`params_read_per_step`): those of no routed expert here, the routed experts a
        # step's tokens activate in _fixed_parts.
        wb = self.weight_dtype_bytes
        # Bytes of a hidden-width activation between the GEMMs (residual stream, norms, collectives):
        # at least bf16's 2 even under fp8/fp4 activations, which only the GEMM inputs are cast to.
        ab = (self.activation_stream_bytes if self.activation_stream_bytes is not None
              else max(ACTIVATION_DTYPE_BYTES[self.activation_dtype], 2))
        # What the non-expert weights and the KV heads split over: the tp GPUs under tensor
        # parallelism; none under attention data parallelism, where each GPU holds them all for
        # its 1/tp share of the batch (so KV bytes per batch position divide by tp instead).
        dp = self.attention_data_parallel
        shards, share = (1, tp) if dp else (tp, 1)
        kv_heads_per_gpu(m, shards)  # checks that the KV heads split over the GPUs they split over
        link_rate, link_latency = self._link()
        expert_bytes = wb if self.expert_weight_dtype_bytes is None else self.expert_weight_dtype_bytes
        gemm_rate = self._gemm_rate()
        # KV bytes a position costs per byte stored: the query heads per KV head on a GPU where
        # a kernel reads KV once per query head.
        reads = 1.0
        if self.attention_kv_reads == "per_query_head" and not m.is_mla:
            reads = (m.num_q_heads / shards) / max(1, m.num_kv_heads // shards)
        consts = {
            # Attention projections and the MLP (an MoE layer's router, top-k and shared experts);
            # biases are too small to count.
            # (The routed experts' multiply-adds are priced apart, per padded row: _expert_flops_per_row.)
            "_gemm_flops_per_token": 2.0 * (m.active_linear_params_per_token - m.num_moe_layers
                                            * m.num_experts_per_tok * m.expert_linear_params) / tp,
            "_expert_flops_per_row": 2.0 * m.num_moe_layers * m.expert_linear_params / tp,
            "_lm_head_flops_per_select": 2.0 * embed / tp,
            "_weight_bytes_no_head": m.params_read_per_step(0, with_lm_head=False) * wb / shards,
            "_weight_bytes_with_head": m.params_read_per_step(0) * wb / shards,
            # Activation traffic plus the embedding row gathered for each position.
            "_act_bytes_per_token": (self.activation_rw_per_layer * num_layers * h * ab + h * ab) / tp,
            # 4 q (c + q/2) = 2 q (2c + q): step_time sums the integer q (2c + q) exactly.
            # (MLA: the absorbed form's multiply-adds, ModelSpec.attention_macs_per_pair_per_layer.)
            "_attn_flops_per_work": float(m.attention_macs_per_pair_per_layer()) * num_layers / tp,
            # MLA: one latent per position per layer, whole on every tensor-parallel rank.
            "_kv_bytes_per_pos": float(num_layers * m.kv_scalars_per_token_per_layer(shards) * self.kv_dtype_bytes)
            * reads / share,
            # Sliding-window layers (gpt-oss, Gemma, Mistral with a window) are priced apart, per layer.
            "_window": m.sliding_window if m.num_sliding_layers else None,
            "_num_sliding_layers": m.num_sliding_layers,
            "_attn_flops_per_work_per_layer": float(m.attention_macs_per_pair_per_layer()) / tp,
            "_kv_bytes_per_pos_per_layer": float(m.kv_scalars_per_token_per_layer(shards) * self.kv_dtype_bytes)
            * reads / share,
            "_compute_rate": self.hardware.peak_flops * self.mfu,
            # GEMMs at their activation dtype's peak (the same float as _compute_rate for bf16).
            "_gemm_compute_rate": gemm_rate,
            "_mem_rate": self.hardware.mem_bandwidth * self.mbu,
            "_comm_per_token": 0.0,
            "_comm_fixed": 0.0,
            "_link_rate": link_rate,
            "_link_latency": link_latency,
            "_overlap": self.transfer_mode == "overlap",
            "_expert_bytes": expert_bytes,
            "_kernel_floors": self.kernels_per_layer * num_layers * self.hardware.kernel_floor_s,
            "_expert_compute_rate": gemm_rate * self._moe_gemm_efficiency(expert_bytes),
            # (Every layer runs in turn, pipeline stages too: a step is the whole model's work.)
            "_moe_fixed": m.num_moe_layers * self.moe_layer_overhead_us * 1e-6,
        }
        bandwidth, hop_latency = self._collective_link()
        if dp and tp > 1:
            # No all-reduce: each MoE layer sends each of a GPU's T/tp tokens to its k experts'
            # GPUs and the results back, (tp-1)/tp of them to another GPU (uniform routing),
            # all GPUs at once: an all-to-all each way, a base latency and one hop each.
            moe_layers = m.num_moe_layers
            consts["_comm_per_token"] = 2 * moe_layers * m.num_experts_per_tok * h * ab * (tp - 1) / tp / tp / bandwidth
            consts["_comm_fixed"] = 2 * moe_layers * (self.collective_base_latency_us * 1e-6 + hop_latency)
        elif tp > 1:
            # Ring all-reduce of T h a bytes: 2(tp-1) steps, each a hop latency and 1/tp of the
            # payload each way (NCCL's ring; Patarasuk & Yuan 2009).
            num_allreduce = self.allreduce_per_layer * num_layers
            ring = 2.0 * (tp - 1) / tp
            consts["_comm_per_token"] = num_allreduce * ring * h * ab / bandwidth
            consts["_comm_fixed"] = num_allreduce * (self.collective_base_latency_us * 1e-6
                                                     + 2 * (tp - 1) * hop_latency)
        if self.pipeline_parallel > 1:
            # Each stage boundary sends the step's T h a bytes of activations to the next stage.
            sends = self.pipeline_parallel - 1
            consts["_comm_per_token"] += sends * h * ab / bandwidth
            consts["_comm_fixed"] += sends * hop_latency
        for name, value in consts.items():
            object.__setattr__(self, name, value)

    # --- the contract -------------------------------------------------------------------------

    def step_time(self, plan: StepPlan) -> float:
        """Seconds for this step: compute (if any sequence runs) and host<->device transfers."""
        transfer = self.transfer_time(plan)
        if not plan.num_seqs:
            return transfer
        num_tokens, num_selecting, sum_context, attn_work, _ = _sums(plan)
        dense, comm, overhead = self._step_fixed_parts(plan, num_tokens, num_selecting)
        compute = self._add_overhead(dense + self._step_attention_time(plan, attn_work, sum_context + num_tokens) + comm,
                                     overhead)
        if self._overlap:
            return max(compute, transfer)
        return compute + transfer

    def repeat_times(self, repeat: Repeat) -> np.ndarray | list[float]:
        """Times of a repeat's steps, bit-equal to step_time on each step's plan: the same sums,
        advanced in integers (step j adds j q_i to each context: j T to the context total and
        2 j q_i^2 to the attention work q (2c + q)), then the same float operations, a step an
        element (numpy's float64 arithmetic is the same IEEE arithmetic, in the same order)."""
        if self._window is not None:
            # Sliding layers cap each context at the window, so their sums do not advance linearly
            # with the step: price each step's plan instead (what simcore.pricing does by default).
            return [self.step_time(step_plan) for step_plan in repeat.plans()]
        plan = repeat.plan
        num_tokens, num_selecting, sum_context, attn_work, sum_squares = _sums(plan)
        dense, comm, overhead = self._step_fixed_parts(plan, num_tokens, num_selecting)
        # (No transfers: a repeat's plan moves no blocks; x + 0.0 and max(x, 0.0) are x.)
        steps = range(repeat.advance, repeat.advance + repeat.num_steps)
        if repeat.num_steps < MIN_STEPS_IN_ARRAYS:
            return [self._add_overhead(dense + self._attention_time(attn_work + 2 * sum_squares * step,
                                                                    sum_context + num_tokens * step + num_tokens) + comm,
                                       overhead)
                    for step in steps]
        steps = np.arange(steps.start, steps.stop, dtype=np.int64)
        attention = self._attention_time(attn_work + 2 * sum_squares * steps, sum_context + num_tokens * steps + num_tokens)
        return self._add_overhead(dense + attention + comm, overhead)

    @property
    def num_batch_shares(self) -> int:
        """The GPUs that each run their own share of a step's batch, each holding E / that many
        routed experts: tensor_parallel under attention data parallelism, else 1."""
        return self.tensor_parallel if self.attention_data_parallel else 1

    def _step_fixed_parts(self, plan: StepPlan, num_tokens: int, num_selecting: int) -> tuple[float, float, float]:
        """`_fixed_parts` of a plan's step (`num_tokens` positions, `num_selecting` selecting),
        its GEMMs over the rows they run (`gemm_rows`)."""
        rows, selecting = self.gemm_rows(num_tokens, plan.num_seqs, plan.num_prefill_tokens, num_selecting)
        return self._fixed_parts(rows, plan.num_seqs, selecting, plan.group_step)

    def gemm_rows(self, num_tokens: int, num_seqs: int, num_prefill_tokens: int, num_selecting: int) -> tuple[int, int]:
        """The rows a step's GEMMs run (`graph_rows`), and how many of them select: its own
        selecting ones and every padded row."""
        rows = self.graph_rows(num_tokens, num_seqs, num_prefill_tokens)
        return rows, num_selecting + rows - num_tokens

    def graph_rows(self, num_tokens: int, num_seqs: int, num_prefill_tokens: int) -> int:
        """The rows a step's GEMMs run: its positions, or for a decode-only step that a captured
        CUDA graph replays (cuda_graph_batch_sizes), the graph's padded batch (per GPU under
        attention data parallelism, times the GPUs)."""
        sizes = self.cuda_graph_batch_sizes
        if not sizes or num_prefill_tokens or num_tokens != num_seqs:
            return num_tokens
        ranks = self.num_batch_shares
        per_rank = -(-num_tokens // ranks)
        padded = min((size for size in sizes if size >= per_rank), default=None)
        return num_tokens if padded is None else max(num_tokens, padded * ranks)

    def _add_overhead(self, gpu: Any, overhead: float) -> Any:
        """A step's device work with its CPU time: after it, or, with `async_scheduling`, hidden
        behind the step before's device work (the scheduler runs one step ahead): the longer of
        the two (of one step, or of steps given as an array)."""
        if not self.async_scheduling:
            return gpu + overhead
        return np.maximum(gpu, overhead) if isinstance(gpu, np.ndarray) else max(gpu, overhead)

    def _attention_time(self, attn_work: Any, kv_positions: Any) -> Any:
        """Attention's roofline: FLOPs 2 H_Q d L sum q (2c + q) against KV bytes read and written
        (of one step, or of steps given as integer arrays)."""
        compute = attn_work * self._attn_flops_per_work / self._compute_rate
        memory = kv_positions * self._kv_bytes_per_pos / self._mem_rate
        return np.maximum(compute, memory) if isinstance(compute, np.ndarray) else max(compute, memory)

    def _step_attention_time(self, plan: StepPlan, attn_work: int, kv_positions: int) -> float:
        """One step's attention; with sliding-window layers, full and sliding layers summed apart
        before the roofline's max: a sliding layer's query sees at most the last `window`
        positions (FLOPs) and reads at most `window` cached ones (bytes)."""
        if self._window is None:
            return self._attention_time(attn_work, kv_positions)
        window_work, window_positions = _window_sums(plan, self._window)
        full, sliding = self.model.num_layers - self._num_sliding_layers, self._num_sliding_layers
        compute = (full * attn_work + sliding * window_work) * self._attn_flops_per_work_per_layer / self._compute_rate
        memory = (full * kv_positions + sliding * window_positions) * self._kv_bytes_per_pos_per_layer / self._mem_rate
        return max(compute, memory)

    def _fixed_parts(self, num_tokens: int, num_seqs: int, num_selecting: int,
                     group_step: int = 0) -> tuple[float, float, float]:
        """The dense, comm and overhead terms (they do not depend on context). A multi-step
        group's later steps (`group_step` > 0) pay no overhead: no scheduler pass plans them and
        their outputs are processed once, when the group ends (vLLM 0.6's multi-step)."""
        weight_bytes = self._weight_bytes_with_head if num_selecting else self._weight_bytes_no_head
        dense_flops = num_tokens * self._gemm_flops_per_token + num_selecting * self._lm_head_flops_per_select
        dense_bytes = weight_bytes + num_tokens * self._act_bytes_per_token
        dense = max(dense_flops / self._gemm_compute_rate, dense_bytes / self._mem_rate) + self._kernel_floors
        if self.model.is_moe:
            # The routed experts' grouped GEMMs, kernels of their own: each layer reads the
            # distinct experts its num_tokens positions route to, in expectation
            # (ModelSpec.expert_params_read), and computes their padded rows; plus each layer's
            # fixed time. A repeat's steps share num_tokens, so step_time and repeat_times get
            # the same float.
            expert_bytes = self.model.expert_params_read(num_tokens) * self._expert_bytes / self.tensor_parallel
            rows = self.model.expected_expert_rows(num_tokens, self.expert_tile_rows(num_tokens))
            dense += max(rows * self._expert_flops_per_row / self._expert_compute_rate,
                         expert_bytes / self._mem_rate) + self._moe_fixed
        comm = num_tokens * self._comm_per_token + self._comm_fixed
        overhead = 0.0 if group_step else self.step_overhead_s + num_seqs * self.per_seq_overhead_s
        return dense, comm, overhead

    def _gemm_rate(self) -> float:
        """FLOP/s of the GEMMs: gemm_peak times mfu."""
        return self.gemm_peak() * self.mfu

    def step_units(self) -> StepUnits:
        """The work a step is made of, a unit at a time, before mfu and mbu derate the rates it
        runs at (what calibration fits them against)."""
        return StepUnits(
            weight_bytes_no_head=self._weight_bytes_no_head, weight_bytes_with_head=self._weight_bytes_with_head,
            gemm_flops_per_token=self._gemm_flops_per_token, lm_head_flops_per_select=self._lm_head_flops_per_select,
            act_bytes_per_token=self._act_bytes_per_token, attn_flops_per_work=self._attn_flops_per_work,
            kv_bytes_per_pos=self._kv_bytes_per_pos, comm_per_token=self._comm_per_token,
            comm_fixed=self._comm_fixed, kernel_floors=self._kernel_floors,
        )

    def gemm_peak(self) -> float:
        """The GEMMs' FLOP/s at mfu 1: the peak their activation dtype runs at, times what that
        peak's GEMMs reach against bf16's (peak_efficiency). Calibration fits mfu against it."""
        name, peak = self.hardware.compute_peak(self.activation_dtype)
        efficiency = {**PEAK_EFFICIENCY, **(self.peak_efficiency or {})}
        return peak * efficiency[name]

    def _moe_gemm_efficiency(self, expert_bytes: float) -> float:
        """moe_gemm_efficiency, or its default: by the experts' width against the compute peak
        (I / (I + moe_half_rate_width x peak / bf16 peak)), times 0.57 where the experts are
        widened inside the kernel (narrower than the compute dtype on a part without an fp4 peak)."""
        if self.moe_gemm_efficiency is not None:
            return self.moe_gemm_efficiency
        width = self.model.expert_intermediate_size
        peak_ratio = self.hardware.compute_peak(self.activation_dtype)[1] / self.hardware.peak_flops
        efficiency = width / (width + self.moe_half_rate_width * peak_ratio) if width else 1.0
        dequantized = expert_bytes < ACTIVATION_DTYPE_BYTES[self.activation_dtype] and self.hardware.peak("fp4") is None
        return efficiency * (DEQUANTIZED_MOE_GEMM_EFFICIENCY if dequantized else 1.0)

    def expert_tile_rows(self, num_tokens: int) -> int:
        """The grouped GEMM's tile rows for a step of `num_tokens` positions: moe_tile_rows, or the
        Triton MoE kernels' choice from the mean tokens per expert (see moe_tile_rows)."""
        if self.moe_tile_rows is not None:
            return self.moe_tile_rows
        # Under expert parallelism (attention_data_parallel over tp GPUs) a GPU holds E / tp experts,
        # and its kernel is handed all T k routed slots of the step pruned to its own experts
        # (TensorRT-LLM's TritonEPRouter: top-k over every expert, then routing_from_bitmatrix with
        # the local expert count), so the tile is picked from T k / (E / tp): tp times the tokens a
        # local expert gets. aiconfigurator's TensorRT-LLM 1.3.0rc20 MoE tables (gpt-oss-120b shape,
        # MXFP4 x bf16 Triton, balanced routing) step where this rule changes tile: at 128 -> 160 and
        # 512 -> 768 tokens under EP4, 256 -> 320 under EP8, 1024 -> 1536 under EP2, 2048 -> 3072 at EP1.
        local_experts = self.model.num_experts / self.num_batch_shares
        return moe_expert_tile_rows(num_tokens * self.model.num_experts_per_tok / local_experts)

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
        dense, comm, overhead = self._step_fixed_parts(plan, num_tokens, num_selecting)
        return {"dense_s": dense, "attention_s": self._step_attention_time(plan, attn_work, sum_context + num_tokens),
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

    def _collective_link(self) -> tuple[float, float]:
        """(bytes/s one way, seconds per hop) of the link collectives run over: on a fully
        connected mesh, at most the tensor_parallel - 1 links a GPU has to the others."""
        if self.collective_link is not None:
            spec = get_link(self.collective_link, where="collective_link")
            bandwidth, peer, hop_latency = spec.allreduce_bandwidth, spec.peer_bytes_per_s, spec.hop_latency
        else:
            hw = self.hardware
            bandwidth, peer, hop_latency = (hw.interconnect_bandwidth, hw.interconnect_peer_bandwidth,
                                            hw.interconnect_latency_s)
        bandwidth = mesh_bandwidth(bandwidth, peer, self.tensor_parallel)
        if self.collective_bandwidth_gb_s is not None:
            bandwidth = self.collective_bandwidth_gb_s * GB
        if self.collective_latency_us is not None:
            hop_latency = self.collective_latency_us * 1e-6
        return float(bandwidth), float(hop_latency)

    def _validate(self) -> None:
        _check_number("mfu", self.mfu, upper=1.0)
        _check_number("mbu", self.mbu, upper=1.0)
        _check_number("step_overhead_s", self.step_overhead_s, allow_zero=True)
        _check_number("per_seq_overhead_s", self.per_seq_overhead_s, allow_zero=True)
        _check_number("kernels_per_layer", self.kernels_per_layer, allow_zero=True)
        if not isinstance(self.async_scheduling, bool):
            raise ValueError(f"async_scheduling: expected true or false, found {self.async_scheduling!r}")
        _check_number("activation_rw_per_layer", self.activation_rw_per_layer, allow_zero=True)
        if self.activation_stream_bytes is not None:
            _check_number("activation_stream_bytes", self.activation_stream_bytes)
        if self.moe_tile_rows is not None:
            _check_int("moe_tile_rows", self.moe_tile_rows, minimum=1)
        if self.cuda_graph_batch_sizes is not None:
            if not isinstance(self.cuda_graph_batch_sizes, (list, tuple)):
                raise ValueError(f"cuda_graph_batch_sizes: expected a list of batch sizes, found "
                                 f"{self.cuda_graph_batch_sizes!r}")
            for size in self.cuda_graph_batch_sizes:
                _check_int("cuda_graph_batch_sizes", size, minimum=1)
        if self.moe_gemm_efficiency is not None:
            _check_number("moe_gemm_efficiency", self.moe_gemm_efficiency, upper=1.0)
        _check_number("moe_half_rate_width", self.moe_half_rate_width, allow_zero=True)
        if self.peak_efficiency is not None:
            if not isinstance(self.peak_efficiency, dict):
                raise ValueError(f"peak_efficiency: expected a mapping of peak name to factor, found "
                                 f"{self.peak_efficiency!r}")
            for name, factor in self.peak_efficiency.items():
                if name not in PEAK_DTYPES:
                    raise ValueError(f"peak_efficiency: unknown peak {name!r}; expected one of {list(PEAK_DTYPES)}")
                _check_number(f"peak_efficiency.{name}", factor, upper=1.0)
        _check_number("moe_layer_overhead_us", self.moe_layer_overhead_us, allow_zero=True)
        _check_int("allreduce_per_layer", self.allreduce_per_layer, minimum=0)
        _check_int("tensor_parallel", self.tensor_parallel, minimum=1)
        _check_int("pipeline_parallel", self.pipeline_parallel, minimum=1)
        if not isinstance(self.attention_data_parallel, bool):
            raise ValueError(f"attention_data_parallel: expected true or false, found {self.attention_data_parallel!r}")
        if self.attention_data_parallel and self.pipeline_parallel > 1:
            raise ValueError("attention_data_parallel: not modelled with pipeline_parallel above 1")
        if self.model.num_layers % self.pipeline_parallel:
            raise ValueError(f"pipeline_parallel: expected a divisor of the model's {self.model.num_layers} layers "
                             f"(stages of equal depth), found {self.pipeline_parallel}")
        _check_number("weight_dtype_bytes", self.weight_dtype_bytes)
        if self.expert_weight_dtype_bytes is not None:
            _check_number("expert_weight_dtype_bytes", self.expert_weight_dtype_bytes)
        if self.activation_dtype not in ACTIVATION_DTYPE_BYTES:
            raise ValueError(f"activation_dtype: expected one of {sorted(ACTIVATION_DTYPE_BYTES)}, "
                             f"found {self.activation_dtype!r}")
        if self.collective_link is not None and not isinstance(self.collective_link, str):
            raise ValueError(f"collective_link: expected a link preset name, found {self.collective_link!r}")
        if self.collective_bandwidth_gb_s is not None:
            _check_number("collective_bandwidth_gb_s", self.collective_bandwidth_gb_s)
        if self.collective_latency_us is not None:
            _check_number("collective_latency_us", self.collective_latency_us, allow_zero=True)
        _check_number("collective_base_latency_us", self.collective_base_latency_us, allow_zero=True)
        _check_int("kv_dtype_bytes", self.kv_dtype_bytes, minimum=1)
        if self.link is not None and self.link_gbps is not None:
            raise ValueError("link and link_gbps: give one host link, not both")
        if self.link is not None and not isinstance(self.link, str):
            raise ValueError(f"link: expected a host link preset name, found {self.link!r}")
        if self.link_gbps is not None:
            _check_number("link_gbps", self.link_gbps)
        if self.transfer_latency_s is not None:
            _check_number("transfer_latency_s", self.transfer_latency_s, allow_zero=True)
        if self.attention_kv_reads not in ATTENTION_KV_READS:
            raise ValueError(f"attention_kv_reads: expected one of {list(ATTENTION_KV_READS)}, "
                             f"found {self.attention_kv_reads!r}")
        if self.transfer_mode not in TRANSFER_MODES:
            raise ValueError(f"transfer_mode: expected one of {list(TRANSFER_MODES)}, found {self.transfer_mode!r}")


def moe_expert_tile_rows(tokens_per_expert: float) -> int:
    """The tile rows a grouped MoE GEMM runs for this mean of tokens per expert, as the Triton MoE
    kernels choose it on NVIDIA parts (triton_kernels matmul_ogs, opt_flags): at most 64 tokens
    (ragged, weight-bound) the power of two at or above twice the mean, within [16, 64]; above,
    the power of two at or above the mean, within [16, 128]."""
    mean = max(1, int(tokens_per_expert))
    if mean <= 64:
        return max(16, min(_next_power_of_two(2 * mean), 64))
    return max(16, min(_next_power_of_two(mean), 128))


def _next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


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


def _window_sums(plan: StepPlan, window: int) -> tuple[int, int]:
    """A sliding layer's attention work and KV positions read plus written, for `plan`.

    Work is the full layers' q (2c + q) with each query's keys capped at the window: new position
    j (1..q) of a sequence sees min(c + j, window) keys, and 2 sum_j min(c + j, window) - q equals
    q (2c + q) when the window holds them all. Reads are min(c, window) cached positions.
    """
    work = positions = 0
    pairs = [(c, 1) for c in plan.decodes.context_lens]
    pairs += [(seq.context_len, seq.num_new_tokens) for seq in plan.listed]
    for context, new in pairs:
        inside = max(0, min(new, window - context))  # new positions whose keys all fit the window
        work += 2 * inside * context + inside * (inside + 1) + 2 * (new - inside) * window - new
        positions += min(context, window) + new
    return work, positions


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
    hardware = ctx.hardware if ctx.hardware is not None else get_hardware(ctx.hardware_name, source=ctx.source)
    try:
        return RooflineCostModel(
            model=ctx.model, hardware=hardware, weight_dtype_bytes=ctx.weight_dtype_bytes,
            kv_dtype_bytes=ctx.kv_dtype_bytes, tensor_parallel=ctx.tensor_parallel,
            expert_weight_dtype_bytes=ctx.expert_weight_dtype_bytes,
            activation_dtype=ctx.activation_dtype, pipeline_parallel=ctx.pipeline_parallel,
            attention_data_parallel=ctx.attention_data_parallel, **params,
        )
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc), source=source, where="cost_model") from None
    except ConfigError as exc:
        if exc.source is not None:
            raise
        raise ConfigError(str(exc), source=source, where="cost_model") from None
