"""Triton varlen paged attention: prefill, chunked prefill and decode rows in one launch.

Grid: (query tile, sequence, query head). A program owns BLOCK_M new tokens of one sequence and
one head, and streams that sequence's keys from the paged cache up to its last query's position
(online softmax in fp32, exp2 domain). Token t of the sequence lives at

    block_tables[s, t // block_size] * block_size + t % block_size   (a cache "slot")

and query i of the sequence sits at position seq_len - q_len + i.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    qk_scale,  # softmax scale * log2(e)
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    stride_slot,  # cache elements between consecutive slots: Hkv * D
    GROUP: tl.constexpr,  # query heads per kv head
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per KV block
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    m_tile = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    q_len = (tl.load(query_start_loc_ptr + seq + 1) - q_start).to(tl.int32)
    if m_tile * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    ctx_len = seq_len - q_len
    kv_head = head // GROUP

    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM
    q_rows = (q_start + offs_m.to(tl.int64))[:, None] * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_rows + offs_d[None, :], mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    q_pos = ctx_len + offs_m

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Keys past this tile's last query are never visible: stop there (causal).
    kv_end = tl.minimum(ctx_len + (m_tile + 1) * BLOCK_M, seq_len)
    bt_row = block_tables_ptr + seq * stride_bt
    for start in range(0, kv_end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_end
        block_ids = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        slots = block_ids * BLOCK_SIZE + (offs_n % BLOCK_SIZE)
        kv_offs = slots[:, None] * stride_slot + kv_head * HEAD_DIM + offs_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0)

        qk = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale
        visible = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        # Every row sees key 0 in the first tile, so m_new is finite from then on.
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v.to(v.dtype))
        m_i = m_new

    out = acc / l_i[:, None]
    o_rows = (q_start + offs_m.to(tl.int64))[:, None] * stride_ot + head * stride_oh
    tl.store(
        out_ptr + o_rows + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Varlen causal attention of q [T, Hq, D] over the paged cache; returns [T, Hq, D]
    (written into out when given)."""
    del max_seq_len  # the loop bound comes from each sequence's own length
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_q_heads % num_kv_heads == 0, f"Hq={num_q_heads} not a multiple of Hkv={num_kv_heads}"
    assert q.stride(2) == 1, "q's last dim must be contiguous"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "KV caches must be contiguous"
    out = torch.empty_like(q) if out is None else out
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    on_gpu = q.is_cuda
    block_m = 64 if on_gpu else 16
    block_n = 64 if on_gpu else 16
    grid = (triton.cdiv(max_query_len, block_m), num_seqs, num_q_heads)
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        seq_lens,
        query_start_loc,
        scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        num_kv_heads * head_dim,
        GROUP=num_q_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=4,
        num_stages=2 if on_gpu else 1,
    )
    return out
