"""Model geometry and KV-cache accounting (seed eq. 21.2 / 21.3)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

GIB = 1024**3

# Bytes per stored scalar for the KV dtypes a user may name.
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder's geometry (Llama and its relatives: Mistral, Qwen2/3, Gemma 2/3, Phi-3; and,
    for KV sizes and the roofline only, mixture-of-experts and latent-attention models: Mixtral,
    Qwen3-MoE, DeepSeek-V2/V3, gpt-oss); enough for KV sizes, roofline costs and the real engine.
    The roofline takes its arithmetic from the methods here rather than re-deriving it."""

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
    # Mixture of experts (Mixtral, Qwen3-MoE, DeepSeek-V2/V3, gpt-oss); key names as their
    # config.json spells them where one name fits. num_experts = 0: every MLP is the dense one.
    num_experts: int = 0  # routed experts per MoE layer (num_local_experts, num_experts, n_routed_experts)
    num_experts_per_tok: int = 0  # routed experts each token uses (top-k)
    # One routed expert's gated-MLP width; None: intermediate_size (Mixtral, gpt-oss).
    moe_intermediate_size: int | None = None
    # Experts every token uses besides its top-k (DeepSeek n_shared_experts), each as wide as a routed one.
    num_shared_experts: int = 0
    # Layers of an MoE model that keep the dense MLP of intermediate_size (DeepSeek's first
    # first_k_dense_replace layers, Qwen3-MoE's mlp_only_layers).
    dense_mlp_layers: tuple[int, ...] = ()
    moe_bias: bool = False  # gpt-oss: biases on the router and on every expert's projections
    # Multi-head latent attention (DeepSeek-V2/V3). kv_lora_rank = 0: ordinary (GQA) attention.
    # The cache holds one latent of kv_lora_rank + qk_rope_head_dim scalars per position per
    # layer, shared by all heads; head_dim is then the q.k width qk_nope_head_dim + qk_rope_head_dim.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0  # 0: q is one projection from the hidden state (DeepSeek-V2-Lite)
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # gpt-oss: a learned logit per head joins every softmax (an "attention sink"); it stores no KV.
    attention_sinks: bool = False
    # The dtype the checkpoint stores its routed experts in when they are quantized apart from the
    # rest of the model (gpt-oss: "mxfp4", its config.json's quantization_config); None: as the
    # rest (an experiment's weight_dtype). Shared experts, router and attention keep weight_dtype.
    expert_weight_dtype: str | None = None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def kv_scalars_per_token_per_layer(self, tensor_parallel: int = 1) -> int:
        """KV scalars one layer stores per position on one GPU.

        GQA: K and V, 2 x H_KV x d_head, the heads split over tensor-parallel ranks (one copy of a
        head on each rank when tp exceeds H_KV; `simcore.capacity.kv_heads_per_gpu` checks the
        split). MLA: one latent, kv_lora_rank + qk_rope_head_dim, not doubled for K and V and not
        per head (DeepSeek-V2 paper, section 2.1.2); every tensor-parallel rank keeps the whole
        latent, as vLLM's MLA backends do, so it does not shrink with tp.
        """
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * max(1, self.num_kv_heads // tensor_parallel) * self.head_dim

    @property
    def kv_bytes_per_token_per_scalar(self) -> int:
        """KV scalars per processed position in every layer: layers x (2 x H_KV x d_head), or
        layers x latent width under MLA.

        What a paged pool that keeps every position of every layer allocates (the simulator's
        block manager and the real engine do); `kv_bytes_needed` caps sliding-window layers.
        """
        return self.num_layers * self.kv_scalars_per_token_per_layer()

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
        return self.kv_scalars_per_token_per_layer() * bytes_per_scalar * self.kv_layer_positions(tokens)

    def kv_bytes_per_token(self, bytes_per_scalar: int = 2) -> int:
        """Eq. 21.3 with B = 1: bytes added by one processed position of one request."""
        return self.kv_bytes_per_token_per_scalar * bytes_per_scalar

    def attention_linear_params_per_layer(self) -> int:
        """One layer's attention projection weights (no biases or norms): what each position multiplies through.

        GQA: q, k, v, o. MLA (DeepSeek-V2 section 2.1): q down/up projections (or one q projection
        when q_lora_rank is 0), the joint KV down-projection to the latent plus the shared RoPE key,
        the latent's up-projection to per-head keys and values, and o. At decode vLLM absorbs that
        up-projection into q and o; the multiplications per position are the same count.
        """
        h, d, heads = self.hidden_size, self.head_dim, self.num_q_heads
        if self.is_mla:
            qk_width = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * heads * qk_width if self.q_lora_rank
                 else h * heads * qk_width)
            kv_down = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_up = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_down + kv_up + heads * self.v_head_dim * h
        return h * (heads * d) + 2 * h * (self.num_kv_heads * d) + (heads * d) * h

    def _attention_params_per_layer(self) -> int:
        """Attention weights with their biases, per-head norms, MLA's latent norms and sink logits."""
        attn = self.attention_linear_params_per_layer()
        if self.attention_bias:
            attn += (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim
        if self.qk_norm:
            attn += 2 * self.head_dim
        if self.is_mla:
            attn += self.q_lora_rank + self.kv_lora_rank  # RMSNorms on the q and KV latents
        if self.attention_sinks:
            attn += self.num_q_heads
        return attn

    @property
    def expert_intermediate_size(self) -> int:
        """One expert's gated-MLP width (routed and shared experts alike)."""
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def expert_linear_params(self) -> int:
        """One expert's gate, up and down matrices: the weights a position routed to it multiplies through."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    @property
    def params_per_expert(self) -> int:
        """One expert's gate, up and down projections (and gpt-oss's biases on them)."""
        width = self.expert_intermediate_size
        return self.expert_linear_params + ((2 * width + self.hidden_size) if self.moe_bias else 0)

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is routed experts (0 for a dense model)."""
        return self.num_layers - len(self.dense_mlp_layers) if self.is_moe else 0

    @property
    def router_params_per_layer(self) -> int:
        """The router's hidden -> expert-logit matrix of an MoE layer (plus gpt-oss's bias)."""
        if not self.is_moe:
            return 0
        return self.hidden_size * self.num_experts + (self.num_experts if self.moe_bias else 0)

    @property
    def routed_expert_params(self) -> int:
        """All routed experts of all MoE layers: the weights a step reads only in part."""
        return self.num_moe_layers * self.num_experts * self.params_per_expert

    def _mlp_params(self) -> int:
        """MLP weights of all layers: dense MLPs, and per MoE layer every routed and shared expert plus the router."""
        dense_layers = self.num_layers - self.num_moe_layers
        moe = (self.num_shared_experts * self.params_per_expert + self.router_params_per_layer) * self.num_moe_layers
        return dense_layers * 3 * self.hidden_size * self.intermediate_size + self.routed_expert_params + moe

    @property
    def num_params(self) -> int:
        """Parameters: embeddings, attention and MLP projections (every expert), norms, lm_head when untied."""
        h = self.hidden_size
        per_layer = self._attention_params_per_layer() + (4 if self.sandwich_norms else 2) * h
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.num_layers * per_layer + self._mlp_params() + embed + lm_head + h

    @property
    def num_active_params(self) -> int:
        """Parameters one token uses: num_params less the routed experts it skips (E - k per MoE layer).

        Counts the embedding table and lm_head whole, as the Mixtral and Qwen3-MoE cards do
        (gpt-oss's card, and by the numbers DeepSeek's, leave the embedding table out: see
        tests/test_moe_mla.py). Equals num_params for a dense model.
        """
        skipped = self.num_moe_layers * (self.num_experts - self.num_experts_per_tok) * self.params_per_expert
        return self.num_params - skipped

    @property
    def active_linear_params_per_token(self) -> int:
        """Weights each position multiplies through in the decoder layers (2 FLOPs each; no
        embeddings or lm_head): attention projections, and the dense MLP or, in an MoE layer, the
        router plus the top-k routed and the shared experts."""
        h = self.hidden_size
        dense_layers = self.num_layers - self.num_moe_layers
        experts_used = self.num_experts_per_tok + self.num_shared_experts
        moe_layer = experts_used * self.expert_linear_params + h * self.num_experts
        return (self.num_layers * self.attention_linear_params_per_layer()
                + dense_layers * 3 * h * self.intermediate_size + self.num_moe_layers * moe_layer)

    def expected_experts_activated(self, num_tokens: int) -> float:
        """Expected distinct routed experts one MoE layer runs for a step of `num_tokens` positions.

        Assumes uniform, independent routing: each position picks k of the E experts uniformly at
        random, so a given expert is missed by one position with probability 1 - k/E and by all
        of them with (1 - k/E)^T; by linearity of expectation E x (1 - (1 - k/E)^T) are hit. That
        is k at T = 1 and tends to E as T grows. Real routers are skewed (fewer distinct experts,
        so this over-counts weight reads) and DeepSeek-V3's group-limited routing is not uniform
        either. 0.0 for a dense model.
        """
        if not self.is_moe or num_tokens <= 0:
            return 0.0
        num_experts = self.num_experts
        return num_experts * (1.0 - (1.0 - self.num_experts_per_tok / num_experts) ** num_tokens)

    def weight_bytes(self, weight_dtype_bytes: float, expert_weight_dtype_bytes: float | None = None) -> float:
        """Bytes of all the weights: the routed experts at `expert_weight_dtype_bytes` (None: as
        the rest), everything else at `weight_dtype_bytes`."""
        total = self.num_params * weight_dtype_bytes
        if expert_weight_dtype_bytes is None or expert_weight_dtype_bytes == weight_dtype_bytes:
            return total
        return total + self.routed_expert_params * (expert_weight_dtype_bytes - weight_dtype_bytes)

    def expected_expert_rows(self, num_tokens: int, tile_rows: int = 1) -> float:
        """Expected rows one MoE layer's routed-expert GEMMs compute for a step of `num_tokens`
        positions when each expert's rows are padded to whole tiles of `tile_rows`.

        A grouped GEMM runs each activated expert's tokens in tiles of tile_rows rows (vLLM's
        fused_moe pads every expert's row count to its BLOCK_SIZE_M, moe_align_block_size; the
        Triton and CUTLASS grouped GEMMs tile each expert apart), so an expert given n tokens
        costs ceil(n / tile_rows) tiles. Under uniform, independent routing (as
        expected_experts_activated) n is Binomial(T, k/E), and E x tile_rows x E[ceil(n / tile_rows)]
        rows are computed, E[ceil(n / m)] being sum over j >= 0 of P(n > j m). tile_rows = 1 gives
        T k, the rows without padding. 0.0 for a dense model.
        """
        if not self.is_moe or num_tokens <= 0:
            return 0.0
        return _expected_padded_rows(int(num_tokens), self.num_experts_per_tok, self.num_experts, int(tile_rows))

    def expert_params_read(self, num_tokens: int) -> float:
        """Routed-expert weights a step of `num_tokens` positions reads: in each MoE layer, the
        `expected_experts_activated` (0.0 for a dense model)."""
        return self.num_moe_layers * self.params_per_expert * self.expected_experts_activated(num_tokens)

    def params_read_per_step(self, num_tokens: int, *, with_lm_head: bool = True) -> float:
        """Weights a step of `num_tokens` positions reads once each (the roofline's weight traffic):
        everything but the embedding table (it gathers rows), the routed experts as
        `expert_params_read` counts them, and lm_head only when the step selects a token (a tied
        one is the embedding matrix, read whole then)."""
        embed = self.vocab_size * self.hidden_size
        resident = self.num_params - embed - (0 if self.tie_word_embeddings else embed) - self.routed_expert_params
        return resident + self.expert_params_read(num_tokens) + (embed if with_lm_head else 0)

    def attention_macs_per_pair_per_layer(self) -> int:
        """Multiply-adds of one (query position, key position) pair in one layer, all query heads.

        GQA: d_head for q.k and d_head for p.v, per query head. MLA in the absorbed form vLLM and
        SGLang run at decode (FlashMLA; DeepSeek-V2 section 2.1.3): q.k over the latent plus the
        RoPE part (kv_lora_rank + qk_rope_head_dim) and p.v over the latent (kv_lora_rank), per
        head. Prefill in vLLM expands the latent into per-head K and V instead, which needs
        qk_nope + qk_rope + v_head_dim per head (320 rather than 1088 for DeepSeek-V3): this one
        form over-prices MLA prefill attention FLOPs.
        """
        if self.is_mla:
            return self.num_q_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.num_q_heads * self.head_dim


@functools.lru_cache(maxsize=1 << 16)
def _expected_padded_rows(num_tokens: int, top_k: int, num_experts: int, tile_rows: int) -> float:
    """num_experts x tile_rows x E[ceil(n / tile_rows)] for n ~ Binomial(num_tokens, top_k / num_experts)."""
    if tile_rows == 1:
        return float(num_tokens * top_k)
    if top_k == num_experts:  # every expert gets every token
        return float(num_experts * tile_rows * -(-num_tokens // tile_rows))
    p = top_k / num_experts
    # The pmf in log space (no underflow at large T): log pmf(n + 1) - log pmf(n) = log((T - n) / (n + 1) p / (1 - p)).
    n = np.arange(num_tokens, dtype=np.float64)
    log_pmf = np.empty(num_tokens + 1)
    log_pmf[0] = num_tokens * math.log1p(-p)
    log_pmf[1:] = log_pmf[0] + np.cumsum(np.log((num_tokens - n) / (n + 1)) + math.log(p / (1 - p)))
    pmf = np.exp(log_pmf)
    tiles = -(-np.arange(num_tokens + 1) // tile_rows)  # ceil(n / tile_rows)
    return float(num_experts * tile_rows * np.dot(pmf, tiles) / pmf.sum())


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
