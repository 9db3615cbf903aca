"""The MLA ops on the Triton side: the latent write and attention with the absorbed query.

    write_latent   one program per token: [c | k_r] into its slot (slot < 0: padding, skipped)
    mla_attention  q_lat = W_uk^T q_nope per head (a batched GEMM), the one-pass latent kernel
                   (kernels/mla_decode.py), then W_uv per head. Decode and prefill rows alike:
                   row t of sequence s sees seq_lens[s] - (query_start_loc[s+1] - t) + 1 tokens.
                   Rows and contexts are computed on the device (searchsorted), so nothing
                   syncs with the host and a CUDA graph captures the whole op.

Prefill rows also take the absorbed form: each row rereads its context, which costs more than
expanding per-head K/V for long prompts (a prefill kernel over expanded K/V is a later step).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .mla_decode import mla_attention_triton


@triton.jit
def _write_latent_kernel(
    latent_ptr,
    rope_ptr,
    cache_ptr,
    slot_ptr,
    stride_lt,
    stride_rt,
    LATENT: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    offs_l = tl.arange(0, BLOCK_L)
    offs_r = tl.arange(0, BLOCK_R)
    c = tl.load(latent_ptr + token * stride_lt + offs_l, mask=offs_l < LATENT)
    r = tl.load(rope_ptr + token * stride_rt + offs_r, mask=offs_r < ROPE)
    dst = cache_ptr + slot * (LATENT + ROPE)
    tl.store(dst + offs_l, c.to(cache_ptr.dtype.element_ty), mask=offs_l < LATENT)
    tl.store(dst + LATENT + offs_r, r.to(cache_ptr.dtype.element_ty), mask=offs_r < ROPE)


def write_latent(
    latent: torch.Tensor, k_rope: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """In place: [c | k_r] of latent [N, L] and k_rope [N, R] at slot_mapping [N] (< 0 skips)
    of cache [blocks, block_size, L + R]."""
    num_tokens, latent_size = latent.shape
    rope = k_rope.shape[1]
    if num_tokens == 0:
        return
    assert latent.stride(1) == 1 and k_rope.stride(1) == 1, "rows must be contiguous"
    assert cache.is_contiguous(), "the latent cache must be contiguous"
    _write_latent_kernel[(num_tokens,)](
        latent, k_rope, cache, slot_mapping, latent.stride(0), k_rope.stride(0),
        LATENT=latent_size, ROPE=rope,
        BLOCK_L=triton.next_power_of_2(latent_size), BLOCK_R=triton.next_power_of_2(rope),
    )  # fmt: skip


def mla_rows(
    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence [T] int32, context [T] int32) of each query row; rows past
    query_start_loc[-1] (graph padding) get context 0."""
    rows = torch.arange(num_rows, dtype=query_start_loc.dtype, device=query_start_loc.device)
    ends = query_start_loc[1:]
    seq = torch.searchsorted(ends, rows, right=True).clamp_(max=seq_lens.numel() - 1)
    ctx = seq_lens[seq] - (ends[seq] - rows) + 1
    ctx = torch.where(rows < query_start_loc[-1], ctx, torch.zeros_like(ctx))
    return seq.to(torch.int32), ctx.to(torch.int32)


def mla_attention(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    kv_b_proj: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    v_head_dim: int,
    scale: float,
    is_decode: bool,
) -> torch.Tensor:
    """Attention [T, H, Dv] of q_nope [T, H, Dn], q_rope [T, H, R] over the latent cache
    [blocks, block_size, L + R] (the new tokens' latents already written); is_decode: one
    row per sequence, row s at position seq_lens[s] - 1."""
    num_rows, num_heads, dn = q_nope.shape
    w = kv_b_proj.view(num_heads, dn + v_head_dim, -1)
    q_lat = torch.bmm(q_nope.transpose(0, 1), w[:, :dn]).transpose(0, 1)  # [T, H, L]
    if is_decode:
        seq = torch.arange(num_rows, dtype=torch.int32, device=q_nope.device)
        ctx = seq_lens[:num_rows].to(torch.int32)
    else:
        seq, ctx = mla_rows(seq_lens, query_start_loc, num_rows)
    o_lat = mla_attention_triton(q_lat, q_rope, cache, block_tables, seq, ctx, scale)
    return torch.bmm(o_lat.transpose(0, 1), w[:, dn:].transpose(1, 2)).transpose(0, 1)
