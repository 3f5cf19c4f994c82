"""A Llama-family decoder built from a ModelSpec: Llama 2/3, Mistral, Qwen2/3, Gemma 2/3, Phi-3.

The model sees one flattened batch of tokens [T] with their positions; attention is delegated to
a callable that owns the paged KV cache (and applies sliding windows and soft-capping), so this
file knows nothing about blocks or requests. q/k/v and gate/up projections are fused into one
weight each (one GEMM on a GPU: fewer, larger kernels; `project` slices wide ones on a CPU); the
weight loader slices Hugging Face's separate tensors into them (Phi-3 ships them fused already). The family differences are spec fields: q/k norms per
head (Qwen3, Gemma 3), Gemma's (1 + w) norms, extra norms around attention and MLP, scaled
embeddings, GeGLU, a final logit soft-cap, and a second RoPE base for sliding layers (Gemma 3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn
from torch.nn import functional as F

from backends.torch.rope import apply_rotary, cos_sin, inverse_frequencies
from simcore.model import ModelSpec

# attend(layer_index, q [T, H_Q, d], k [T, H_KV, d], v [T, H_KV, d]) -> [T, H_Q, d]; it also stores k, v.
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# Hugging Face's LlamaConfig.initializer_range default; random weights use it so activations
# stay in a realistic range (not exploding) and logits are not all ties.
INIT_STD = 0.02


class RMSNorm(nn.Module):
    """RMSNorm scaling by (offset + weight): offset 0 for Llama, 1 for Gemma (weights stored around 0)."""

    def __init__(self, size: int, eps: float, offset: float = 0.0, **factory) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((size,), 1.0 - offset, **factory))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            # Gemma scales in float32 and casts last.
            return (xf * (self.offset + self.weight.float())).to(x.dtype)
        # Llama normalises in float32, then scales in the activation dtype.
        return self.weight * xf.to(x.dtype)


# On the CPU, MKL runs a few rows (a decode batch) against a wide weight 1.3-1.6x faster in slices
# of about this many output features than in one call (lm_head and the fused MLP projection of
# the 1024-wide benchmark model, batch 8-32, 1-2 threads); GPUs and large batches prefer one call.
CPU_OUTPUT_SLICE = 1024
CPU_SLICED_MAX_ROWS = 128


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), sliced by output features where that is faster (see CPU_OUTPUT_SLICE)."""
    if x.device.type != "cpu" or x.shape[0] > CPU_SLICED_MAX_ROWS or weight.shape[0] < 2 * CPU_OUTPUT_SLICE:
        return F.linear(x, weight, bias)
    weights = weight.split(CPU_OUTPUT_SLICE)
    biases = [None] * len(weights) if bias is None else bias.split(CPU_OUTPUT_SLICE)
    return torch.cat([F.linear(x, w, b) for w, b in zip(weights, biases, strict=True)], dim=-1)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, **factory) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        eps, offset = spec.rms_norm_eps, spec.norm_weight_offset
        self.num_q_heads, self.num_kv_heads, self.head_dim = spec.num_q_heads, spec.num_kv_heads, d
        self.q_size, self.kv_size = spec.num_q_heads * d, spec.num_kv_heads * d
        self.input_norm = RMSNorm(h, eps, offset, **factory)
        self.qkv_proj = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=spec.attention_bias, **factory)
        self.q_norm = RMSNorm(d, eps, offset, **factory) if spec.qk_norm else None
        self.k_norm = RMSNorm(d, eps, offset, **factory) if spec.qk_norm else None
        self.o_proj = nn.Linear(self.q_size, h, bias=False, **factory)
        # Llama: post_attn_norm is the MLP's input norm. Gemma: it normalises the attention
        # output, and the MLP has its own pre and post norms.
        self.post_attn_norm = RMSNorm(h, eps, offset, **factory)
        self.pre_mlp_norm = RMSNorm(h, eps, offset, **factory) if spec.sandwich_norms else None
        self.post_mlp_norm = RMSNorm(h, eps, offset, **factory) if spec.sandwich_norms else None
        self.intermediate_size = spec.intermediate_size
        self.gate_up_proj = nn.Linear(h, 2 * spec.intermediate_size, bias=False, **factory)
        self.down_proj = nn.Linear(spec.intermediate_size, h, bias=False, **factory)
        self.act = ACTIVATIONS[spec.hidden_act]

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer_index: int, attend: AttendFn
    ) -> torch.Tensor:
        t = x.shape[0]
        qkv = project(self.input_norm(x), self.qkv_proj.weight, self.qkv_proj.bias)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = q.view(t, self.num_q_heads, self.head_dim), k.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        attn = project(attend(layer_index, q, k, v).reshape(t, self.q_size), self.o_proj.weight)
        if self.pre_mlp_norm is None:
            x = x + attn
            gate, up = project(self.post_attn_norm(x), self.gate_up_proj.weight).split(self.intermediate_size, dim=-1)
            return x + project(self.act(gate) * up, self.down_proj.weight)
        x = x + self.post_attn_norm(attn)
        gate, up = project(self.pre_mlp_norm(x), self.gate_up_proj.weight).split(self.intermediate_size, dim=-1)
        return x + self.post_mlp_norm(project(self.act(gate) * up, self.down_proj.weight))


class LlamaModel(nn.Module):
    """Embeddings, decoder layers, final norm and lm_head (tied to the embeddings or not)."""

    def __init__(self, spec: ModelSpec, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size, **factory)
        self.layers = nn.ModuleList(DecoderLayer(spec, **factory) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, spec.norm_weight_offset, **factory)
        self.lm_head = None if spec.tie_word_embeddings else nn.Linear(
            spec.hidden_size, spec.vocab_size, bias=False, **factory
        )
        self.register_buffer("inv_freq", inverse_frequencies(spec).to(device), persistent=False)
        # Gemma: sqrt(hidden) rounded to the weights' dtype first, as transformers rounds it.
        self.embedding_scale = torch.tensor(spec.embedding_scale, dtype=dtype).item()
        # Gemma 3's sliding layers rotate with their own base (and without rope_scaling).
        local_inv_freq = None
        if spec.rope_local_theta is not None and spec.num_sliding_layers:
            local = replace(spec, rope_theta=spec.rope_local_theta, rope_scaling=None)
            local_inv_freq = inverse_frequencies(local).to(device)
        self.register_buffer("local_inv_freq", local_inv_freq, persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        """Final-norm hidden states [T, hidden] of a flattened batch."""
        x = self.embed(input_ids)
        spec = self.spec
        if self.embedding_scale != 1.0:
            x = x * self.embedding_scale
        cos, sin = cos_sin(self.inv_freq, positions, x.dtype)
        local = cos_sin(self.local_inv_freq, positions, x.dtype) if self.local_inv_freq is not None else None
        for i, layer in enumerate(self.layers):
            if local is not None and spec.is_sliding(i):
                x = layer(x, *local, i, attend)
            else:
                x = layer(x, cos, sin, i, attend)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [rows, vocab] for the rows that select a token (and only those)."""
        logits = project(hidden, self.embed.weight if self.lm_head is None else self.lm_head.weight)
        cap = self.spec.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        """Seeded N(0, 0.02) weights and unit norms, drawn on the model's device (fast for 8B)."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0 - self.spec.norm_weight_offset)  # a unit scale
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.normal_(0.0, INIT_STD, generator=gen)

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())
