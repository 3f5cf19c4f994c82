"""Weight, activation and KV scalar types: their bytes, and which tensor-core peak a GEMM runs at.

Engines run a quantized checkpoint in one of two ways, and the roofline prices both:
- W8A8 (fp8 or int8 weights and activations): the GEMM runs on the 8-bit tensor cores, at the
  part's fp8 or int8 peak (vLLM's fp8 and int8 w8a8 schemes quantize activations per GEMM);
- weight-only (4-bit GPTQ/AWQ, Marlin kernels): weights are stored in 4 bits (0.5 bytes a
  parameter; group scales are left out) and widened to bf16 in the kernel, so the GEMM runs at
  the bf16 peak. With 4-bit activations too (NVFP4 W4A4 on Blackwell) it runs at the fp4 peak.
The compute dtype is the activation dtype. A part without a peak for it falls back to the next
wider one it has (fp4 -> fp8 -> bf16, int8 -> bf16), which is what engines do there: an fp8
checkpoint on an A100 runs weight-only (Marlin) at the bf16 peak. fp32 and fp16 are priced at
the bf16 peak (the roofline does not model TF32 or FP32 rates).
"""

from __future__ import annotations

from simcore.model import DTYPE_BYTES

# Bytes per stored weight: the KV dtypes plus 4-bit formats.
WEIGHT_DTYPE_BYTES: dict[str, float] = {**DTYPE_BYTES, "fp4": 0.5, "int4": 0.5}
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


def default_activation_dtype(weight_dtype: str) -> str:
    """The activations engines run a checkpoint of this weight dtype with: 8-bit weights as W8A8,
    4-bit weights weight-only (bf16 activations), wider weights in their own type."""
    if weight_dtype in ("fp8", "int8"):
        return weight_dtype
    if WEIGHT_DTYPE_BYTES.get(weight_dtype) == 0.5:
        return "bf16"
    return weight_dtype
