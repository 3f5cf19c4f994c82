"""A Llama-family decoder (Llama 2/3, Mistral without sliding window, Qwen2) built from a ModelSpec.

The model sees one flattened batch of tokens [T] with their positions; attention is delegated to
a callable that owns the paged KV cache, so this file knows nothing about blocks or requests.
q/k/v and gate/up projections are fused into one GEMM each (fewer, larger kernels); the weight
loader slices Hugging Face's separate tensors into them.
"""

from __future__ import annotations

from collections.abc import Callable

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
    def __init__(self, size: int, eps: float, **factory) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, **factory))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32, as the reference does, then scale in the activation dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, **factory) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.num_q_heads, self.num_kv_heads, self.head_dim = spec.num_q_heads, spec.num_kv_heads, d
        self.q_size, self.kv_size = spec.num_q_heads * d, spec.num_kv_heads * d
        self.input_norm = RMSNorm(h, spec.rms_norm_eps, **factory)
        self.qkv_proj = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=spec.attention_bias, **factory)
        self.o_proj = nn.Linear(self.q_size, h, bias=False, **factory)
        self.post_attn_norm = RMSNorm(h, spec.rms_norm_eps, **factory)
        self.intermediate_size = spec.intermediate_size
        self.gate_up_proj = nn.Linear(h, 2 * spec.intermediate_size, bias=False, **factory)
        self.down_proj = nn.Linear(spec.intermediate_size, h, bias=False, **factory)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer_index: int, attend: AttendFn
    ) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(self.input_norm(x))
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rotary(q.view(t, self.num_q_heads, self.head_dim), cos, sin)
        k = apply_rotary(k.view(t, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        attn = attend(layer_index, q, k, v)
        x = x + self.o_proj(attn.reshape(t, self.q_size))
        gate, up = self.gate_up_proj(self.post_attn_norm(x)).split(self.intermediate_size, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)


class LlamaModel(nn.Module):
    """Embeddings, decoder layers, final norm and lm_head (tied to the embeddings or not)."""

    def __init__(self, spec: ModelSpec, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size, **factory)
        self.layers = nn.ModuleList(DecoderLayer(spec, **factory) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **factory)
        self.lm_head = None if spec.tie_word_embeddings else nn.Linear(
            spec.hidden_size, spec.vocab_size, bias=False, **factory
        )
        self.register_buffer("inv_freq", inverse_frequencies(spec).to(device), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        """Final-norm hidden states [T, hidden] of a flattened batch."""
        x = self.embed(input_ids)
        cos, sin = cos_sin(self.inv_freq, positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, i, attend)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [rows, vocab] for the rows that select a token (and only those)."""
        weight = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        """Seeded N(0, 0.02) weights and unit norms, drawn on the model's device (fast for 8B)."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.normal_(0.0, INIT_STD, generator=gen)

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())
