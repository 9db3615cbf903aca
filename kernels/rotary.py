"""Triton rotary embedding, neox / HF rotate_half style: element j pairs with j + D/2.

    x = [x1 | x2]  (halves of head_dim)   ->   [x1*cos - x2*sin | x2*cos + x1*sin]

cos_sin_cache [max_pos, D] holds cos in its first D/2 columns and sin in its last D/2.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    x_ptr,
    stride_t,
    stride_h,
    token,
    cos,
    sin,
    NUM_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h < NUM_HEADS)[:, None] & (offs_d < HALF)[None, :]
    ptr1 = x_ptr + token * stride_t + offs_h[:, None] * stride_h + offs_d[None, :]
    x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr1 + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptr1, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(ptr1 + HALF, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    positions_ptr,
    cache_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cache,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    cos = tl.load(cache_ptr + pos * stride_cache + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + offs_d, mask=d_mask, other=0.0).to(
        tl.float32
    )
    _rotate_heads(
        q_ptr,
        stride_qt,
        stride_qh,
        token,
        cos[None, :],
        sin[None, :],
        NUM_Q_HEADS,
        HALF,
        BLOCK_QH,
        BLOCK_HALF,
    )
    _rotate_heads(
        k_ptr,
        stride_kt,
        stride_kh,
        token,
        cos[None, :],
        sin[None, :],
        NUM_KV_HEADS,
        HALF,
        BLOCK_KH,
        BLOCK_HALF,
    )


def rotary_triton(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotates q [T, Hq, D] and k [T, Hkv, D] IN PLACE (when last dims are contiguous) and
    returns them."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    assert head_dim % 2 == 0, f"rotary needs an even head_dim, got {head_dim}"
    assert cos_sin_cache.shape[1] == head_dim, (
        f"cos_sin_cache has {cos_sin_cache.shape[1]} columns, head_dim is {head_dim}"
    )
    q = q if q.stride(2) == 1 else q.contiguous()
    k = k if k.stride(2) == 1 else k.contiguous()
    cache = cos_sin_cache if cos_sin_cache.stride(1) == 1 else cos_sin_cache.contiguous()
    if num_tokens == 0:
        return q, k
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        q,
        k,
        positions,
        cache,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cache.stride(0),
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        HALF=half,
        BLOCK_QH=triton.next_power_of_2(num_q_heads),
        BLOCK_KH=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(half),
        num_warps=4,
    )
    return q, k
