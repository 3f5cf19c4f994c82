"""Weight, activation and KV scalar types: their bytes, and which tensor-core peak a GEMM runs at.

Engines run a quantized checkpoint in one of two ways, and the roofline prices both:
- W8A8 (fp8 or int8 weights and activations): the GEMM runs on the 8-bit tensor cores, at the
  part's fp8 or int8 peak (vLLM's fp8 and int8 w8a8 schemes quantize activations per GEMM);
- weight-only (4-bit GPTQ/AWQ, Marlin kernels): weights are stored in 4 bits (0.5 bytes a
  parameter; group scales are left out) and widened to bf16 in the kernel, so the GEMM runs at
  the bf16 peak. With 4-bit activations too (NVFP4 W4A4 on Blackwell) it runs at the fp4 peak.
  `fp4` and `nvfp4` checkpoints (NVFP4, as ModelOpt writes them) run W4A4 by default on a part
  with an fp4 peak (TensorRT-LLM and vLLM quantize the activations to NVFP4 there) and
  weight-only elsewhere; `int4` (GPTQ/AWQ) always weight-only.
- `mxfp4` (OCP microscaling fp4: 4-bit E2M1 values and one 8-bit E8M0 scale per block of 32,
  4.25 bits a parameter; OCP Microscaling Formats (MX) v1.0 spec, section 5) is the format of
  gpt-oss's routed experts, the rest of that checkpoint bf16 (its config.json
  `quantization_config`: quant_method mxfp4, modules_to_not_convert the attention, router,
  embeddings and lm_head). On Hopper the MoE GEMM widens it to bf16, on Blackwell it runs with
  MXFP8 activations (TensorRT-LLM's gpt-oss deployment guide, MoE backend matrix: H200 activation
  BF16, B200 activation MXFP8, MoE weights MXFP4): by default fp8 activations on a part with an
  fp4 peak, bf16 elsewhere.
The compute dtype is the activation dtype. A part without a peak for it falls back to the next
wider one it has (fp4 -> fp8 -> bf16, int8 -> bf16), which is what engines do there: an fp8
checkpoint on an A100 runs weight-only (Marlin) at the bf16 peak. fp32 and fp16 are priced at
the bf16 peak (the roofline does not model TF32 or FP32 rates).
"""

from __future__ import annotations

from simcore.model import DTYPE_BYTES

# Bytes per stored weight: the KV dtypes plus 4-bit formats.
# nvfp4 and mxfp4 count their block scales: NVFP4 one fp8 (E4M3) scale per 16 values, 4.5 bits a
# parameter (NVIDIA's NVFP4 format, as ModelOpt's "quant_algo": "NVFP4", group_size 16 writes it);
# MXFP4 one E8M0 scale per 32, 4.25 bits (OCP Microscaling Formats v1.0). `fp4` and `int4` leave
# scales out (0.5 bytes).
WEIGHT_DTYPE_BYTES: dict[str, float] = {**DTYPE_BYTES, "fp4": 0.5, "int4": 0.5, "nvfp4": 4.5 / 8, "mxfp4": 4.25 / 8}
# Bytes per activation scalar (hidden-width tensors between layers, all-reduce payloads).
ACTIVATION_DTYPE_BYTES: dict[str, float] = {**DTYPE_BYTES, "fp4": 0.5}
# The peaks a hardware entry may give (simcore/hardware.yaml `peak_tflops`).
PEAK_DTYPES = ("bf16", "fp8", "int8", "fp4")
# Activation dtype -> the peak its GEMMs run at.
PEAK_OF_DTYPE: dict[str, str] = {
    "fp32": "bf16", "float32": "bf16", "bf16": "bf16", "bfloat16": "bf16", "fp16": "bf16", "float16": "bf16",
    "fp8": "fp8", "int8": "int8", "fp4": "fp4",
}
# A peak the part lacks -> the next wider one tried.
WIDER_PEAK: dict[str, str] = {"fp4": "fp8", "fp8": "bf16", "int8": "bf16"}
# The share of its peak a GEMM on each peak reaches, relative to the share a bf16 GEMM reaches of
# the bf16 peak: narrower tensor cores are fed by the same memory system and finish their tiles
# sooner, so they sit idle more. Medians over serving shapes (m 2048-8192, n and k 4096-16384)
# measured with TensorRT-LLM 1.3.0rc20 by NVIDIA's aiconfigurator (ai-dynamo/aiconfigurator at
# 095f58a5, aic-core/src/aiconfigurator_core/systems/data/{h200,b200}_sxm/gemm/trtllm/1.3.0rc20/
# gemm_perf.parquet): H200 bf16 0.79 and fp8 0.60 of their peaks (0.76); B200 bf16 0.66, fp8 0.49
# (0.74) and nvfp4 0.37 (0.56). int8 is taken as fp8 (no measurement).
PEAK_EFFICIENCY: dict[str, float] = {"bf16": 1.0, "fp8": 0.75, "int8": 0.75, "fp4": 0.56}


def default_activation_dtype(weight_dtype: str, fp4_peak: bool = False) -> str:
    """The activations engines run a checkpoint of this weight dtype with: 8-bit weights as W8A8,
    fp4/nvfp4 weights as W4A4 and mxfp4 as W4A8 where the part has an fp4 peak (`fp4_peak`: a
    Blackwell), other 4-bit weights weight-only (bf16 activations), wider weights in their own type."""
    if weight_dtype in ("fp8", "int8"):
        return weight_dtype
    if weight_dtype in ("fp4", "nvfp4") and fp4_peak:
        return "fp4"
    if weight_dtype == "mxfp4" and fp4_peak:
        return "fp8"
    if WEIGHT_DTYPE_BYTES.get(weight_dtype, 2) < 1:
        return "bf16"
    return weight_dtype
