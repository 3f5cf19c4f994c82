"""Model geometry and KV-cache accounting (seed eq. 21.2 / 21.3)."""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 1024**3

# Bytes per stored scalar for the KV dtypes a user may name.
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder's geometry (Llama and its relatives: Mistral, Qwen2/3, Gemma 2/3, Phi-3); enough
    for KV sizes, roofline costs and the real engine."""

    name: str
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    attention_bias: bool = False  # qwen2 puts a bias on q/k/v
    # Families past Llama (Qwen3, Gemma 2/3, Phi-3, Mistral with a window). Every default below
    # describes a Llama layer, so a spec that leaves them alone means what it meant before.
    hidden_act: str = "silu"  # the gated MLP's activation: silu (SwiGLU) or gelu_pytorch_tanh (GeGLU)
    qk_norm: bool = False  # an RMSNorm over each head of q and k before RoPE (Qwen3, Gemma 3)
    # Gemma stores RMSNorm weights as an offset from one: the scale is (norm_weight_offset + w).
    norm_weight_offset: float = 0.0
    # Gemma 2/3: a norm on the attention output and a second pair around the MLP (4 per layer).
    sandwich_norms: bool = False
    embedding_scale: float = 1.0  # Gemma multiplies embeddings by sqrt(hidden_size)
    # Attention scores are scaled by query_pre_attn_scalar ** -0.5 (Gemma) instead of head_dim ** -0.5.
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
    final_logit_softcapping: float | None = None  # the same on the output logits
    # Sliding-window attention: a layer listed here attends to the last `sliding_window`
    # positions (itself included) and so needs only that many positions of KV.
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()
    # RoPE base of the sliding layers when it differs from rope_theta (Gemma 3's local base;
    # rope_scaling then applies to the full-attention layers only).
    rope_local_theta: float | None = None

    @property
    def kv_bytes_per_token_per_scalar(self) -> int:
        """KV scalars per processed position in every layer: 2 (K and V) x layers x H_KV x d_head.

        What a paged pool that keeps every position of every layer allocates (the simulator's
        block manager and the real engine do); `kv_bytes_needed` caps sliding-window layers.
        """
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def attention_scale(self) -> float:
        """The factor on q.k before the softmax."""
        return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def num_sliding_layers(self) -> int:
        return len(self.sliding_layers) if self.sliding_window is not None else 0

    def is_sliding(self, layer: int) -> bool:
        """Whether `layer` attends through the sliding window."""
        return self.sliding_window is not None and layer in self.sliding_layers

    def kv_layer_positions(self, tokens: int) -> int:
        """(layer, position) pairs of KV a request of `tokens` positions needs (and a query reads).

        Full-attention layers keep every position; a sliding layer only its last `sliding_window`.
        """
        sliding = self.num_sliding_layers
        window = min(tokens, self.sliding_window) if sliding else 0
        return (self.num_layers - sliding) * tokens + sliding * window

    def kv_bytes_needed(self, tokens: int, bytes_per_scalar: int = 2) -> int:
        """KV bytes one request of `tokens` processed positions needs, sliding windows capped."""
        return 2 * self.num_kv_heads * self.head_dim * bytes_per_scalar * self.kv_layer_positions(tokens)

    def kv_bytes_per_token(self, bytes_per_scalar: int = 2) -> int:
        """Eq. 21.3 with B = 1: bytes added by one processed position of one request."""
        return self.kv_bytes_per_token_per_scalar * bytes_per_scalar

    @property
    def num_params(self) -> int:
        """Parameters: embeddings, attention and MLP projections, norms, lm_head when untied."""
        h, d = self.hidden_size, self.head_dim
        attn = h * (self.num_q_heads * d) + 2 * h * (self.num_kv_heads * d) + (self.num_q_heads * d) * h
        if self.attention_bias:
            attn += (self.num_q_heads + 2 * self.num_kv_heads) * d
        if self.qk_norm:
            attn += 2 * d
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + (4 if self.sandwich_norms else 2) * h
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.num_layers * per_layer + embed + lm_head + h


def kv_cache_bytes(
    *, layers: int, batch: int, kv_heads: int, seq_len: int, head_dim: int, bytes_per_value: int = 2
) -> int:
    """Ideal key-plus-value payload, eq. 21.2: 2 * layers * B * H_KV * T * d_h * s."""
    return 2 * layers * batch * kv_heads * seq_len * head_dim * bytes_per_value


def kv_cache_gib(
    *, layers: int, batch: int, kv_heads: int, seq_len: int, head_dim: int, bytes_per_value: int = 2
) -> float:
    """Eq. 21.2 in GiB (divided by 1024**3), the seed's `kv_cache_gib`."""
    return (
        kv_cache_bytes(
            layers=layers,
            batch=batch,
            kv_heads=kv_heads,
            seq_len=seq_len,
            head_dim=head_dim,
            bytes_per_value=bytes_per_value,
        )
        / GIB
    )
