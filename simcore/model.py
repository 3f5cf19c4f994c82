"""Model geometry and KV-cache accounting (seed eq. 21.2 / 21.3)."""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 1024**3

# Bytes per stored scalar for the KV dtypes a user may name.
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class ModelSpec:
    """A Llama-family decoder's geometry; enough for KV sizes, roofline costs and the real engine."""

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

    @property
    def kv_bytes_per_token_per_scalar(self) -> int:
        """KV scalars per processed position: 2 (K and V) x layers x H_KV x d_head."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

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
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
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
