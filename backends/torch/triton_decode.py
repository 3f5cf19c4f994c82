"""A Triton paged decode kernel: flash-decoding over KV blocks read in place through block tables.

One program per (row, KV head, split). It loads the row's query heads that share this KV head
(GQA group, padded to 16 for tensor-core dots), walks its split's tokens in tiles of BLOCK_N
(each token's block looked up in the block table, so any block size works), and keeps an
online softmax. Splits write partial outputs and base-2 log-sum-exps that a few torch ops
combine, which keeps long-context, small-batch decodes spread over all SMs. Nothing here syncs
with the host or allocates data-dependent sizes, so the launch can be captured in a CUDA graph.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from backends.torch.attention import AttentionMetadata

LOG2E = 1.4426950408889634
# Programs to aim for when choosing splits: a few waves on an H100/H200 (132 SMs).
TARGET_PROGRAMS = 264
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 32


def interpreter_enabled() -> bool:
    """TRITON_INTERPRET=1 runs kernels on the CPU (numpy), which lets tests check the math here."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _paged_decode_kernel(
    Q, K, V, BlockTables, SeqLens, Acc, Lse,
    qk_scale, num_splits,
    stride_qb, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_tb,
    stride_ab, stride_ah, stride_as,
    stride_lb, stride_lh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SeqLens + row).to(tl.int32)
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    q = tl.load(Q + row * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    for tile in range(start, end, BLOCK_N):
        offs_n = tile + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        block = tl.load(BlockTables + row * stride_tb + offs_n // PAGE, mask=n_mask, other=0).to(tl.int64)
        slot = offs_n % PAGE
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(K + block[:, None] * stride_kb + slot[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(n_mask[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + block[:, None] * stride_vb + slot[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # An empty split (short row) reports weight zero: lse = -inf, output 0.
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    tl.store(Acc + row * stride_ab + heads[:, None] * stride_ah + split * stride_as + offs_d[None, :], out,
             mask=g_mask[:, None] & d_mask[None, :])
    tl.store(Lse + row * stride_lb + heads * stride_lh + split, lse, mask=g_mask)


def choose_splits(num_rows: int, num_kv_heads: int, max_len: int) -> int:
    """Enough splits to fill the GPU when rows are few, never below MIN_TOKENS_PER_SPLIT each."""
    programs = max(1, num_rows * num_kv_heads)
    want = triton.cdiv(TARGET_PROGRAMS, programs)
    return max(1, min(want, triton.cdiv(max(max_len, 1), MIN_TOKENS_PER_SPLIT), MAX_SPLITS))


def paged_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, num_splits: int, block_n: int = 64,
) -> torch.Tensor:
    """Attention of single queries q [B, H_Q, d] over paged caches [blocks, block_size, H_KV, d]."""
    rows, num_q_heads, head_dim = q.shape
    num_kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    group = num_q_heads // num_kv_heads
    q = q.contiguous() if q.stride(-1) != 1 else q
    acc = torch.empty((rows, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.empty((rows, num_q_heads, num_splits), dtype=torch.float32, device=q.device)
    grid = (rows, num_kv_heads, num_splits)
    _paged_decode_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, acc, lse,
        scale * LOG2E, num_splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        acc.stride(0), acc.stride(1), acc.stride(2),
        lse.stride(0), lse.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        PAGE=page, BLOCK_N=block_n, IEEE=q.dtype == torch.float32,
    )
    if num_splits == 1:
        return acc[:, :, 0].to(q.dtype)
    # Combine splits: weights 2^(lse - max); empty splits have weight 0.
    top = lse.amax(-1, keepdim=True)
    weights = torch.exp2(lse - top)
    out = (acc * weights[..., None]).sum(2) / weights.sum(-1)[..., None]
    return out.to(q.dtype)


class TritonDecode:
    name = "triton"

    def __init__(self, fixed_splits: int | None = None) -> None:
        # CUDA graphs bake the grid in: a captured runner passes a fixed split count.
        self.fixed_splits = fixed_splits

    def begin_step(self, meta: AttentionMetadata) -> None:
        # None: chosen at the first layer's call, when the head count is at hand.
        meta.backend_state = self.fixed_splits

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata, scale: float) -> torch.Tensor:
        splits = meta.backend_state
        if splits is None:
            splits = choose_splits(q.shape[0], k_cache.shape[2], meta.decode_max_len)
            meta.backend_state = splits
        return paged_decode(q, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, scale, splits)
