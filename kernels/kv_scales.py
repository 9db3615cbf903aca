"""The fp8 KV cache's scales set at the first write (kernels/kv_quant.update_kv_scales) as one
Triton kernel, for the GPU's forwards.

The torch form runs ~10 kernels a layer (norm, pair norms, two reductions, the conditional
copy) on every step although a scale, once set, never changes: ~1.3 ms of a 16 ms fp8 decode
step of Llama-3.1-8B at 256 sequences (H100, 2026-12-05). Here one program per (k | v, KV head)
loads its scale first and, when it is set, loops zero times: a step after the first pays one
small launch a layer, and a CUDA graph replays it unchanged (no host sync decides anything).
An unset scale gets what the torch form computes: bound / 448 * HEADROOM, the bound being the
largest pair norm of the batch's keys (after the q/k norm, before rotary) or the largest |v|.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kv_quant import FP8_MAX, HEADROOM

_TOKENS = 32  # rows a loop iteration reads


@triton.jit
def _kv_scales_kernel(
    qkv_ptr, norm_ptr, k_scale_ptr, v_scale_ptr, num_tokens, row_stride, k_col0, eps, factor,
    NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr, HAS_NORM: tl.constexpr,
    TOKENS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    is_v = pid >= NUM_KV_HEADS
    head = pid % NUM_KV_HEADS
    scale_ptr = tl.where(is_v, v_scale_ptr, k_scale_ptr) + head
    unset = tl.load(scale_ptr) <= 0.0
    iterations = tl.where(unset, tl.cdiv(num_tokens, TOKENS), 0)
    col0 = k_col0 + (is_v.to(tl.int64) * NUM_KV_HEADS + head) * (2 * HALF)
    dims = tl.arange(0, HALF)
    rows = tl.arange(0, TOKENS)
    if HAS_NORM:
        w_lo = tl.load(norm_ptr + dims).to(tl.float32)
        w_hi = tl.load(norm_ptr + HALF + dims).to(tl.float32)
    bound = tl.zeros((TOKENS,), dtype=tl.float32)
    for it in range(0, iterations):
        row = it * TOKENS + rows
        ok = row < num_tokens
        at = qkv_ptr + row.to(tl.int64)[:, None] * row_stride + col0 + dims[None, :]
        lo = tl.load(at, mask=ok[:, None], other=0.0).to(tl.float32)
        hi = tl.load(at + HALF, mask=ok[:, None], other=0.0).to(tl.float32)
        if is_v:
            seen = tl.maximum(tl.max(tl.abs(lo), axis=1), tl.max(tl.abs(hi), axis=1))
        else:
            if HAS_NORM:
                mean_sq = (tl.sum(lo * lo, axis=1) + tl.sum(hi * hi, axis=1)) / (2 * HALF)
                inv = tl.rsqrt(mean_sq + eps)
                lo = lo * inv[:, None] * w_lo[None, :]
                hi = hi * inv[:, None] * w_hi[None, :]
            seen = tl.max(tl.sqrt(lo * lo + hi * hi), axis=1)  # >= |rotated k|
        bound = tl.maximum(bound, tl.where(ok, seen, 0.0))
    if unset:
        tl.store(scale_ptr, tl.maximum(tl.max(bound, axis=0), 1e-6) * factor)


def update_kv_scales_triton(
    qkv: torch.Tensor,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    num_kv_heads: int,
    head_dim: int,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> None:
    """kernels/kv_quant.update_kv_scales's contract: in place, the unset (0) scales [Hkv] from
    this batch's k and v (qkv [T, W], its last 2 x Hkv x D columns)."""
    if qkv.shape[0] == 0:
        return
    if qkv.stride(1) != 1:
        raise ValueError("update_kv_scales_triton: qkv's columns must be contiguous")
    norm = k_norm_weight if k_norm_weight is not None else k_scale  # unread without a norm
    _kv_scales_kernel[(2 * num_kv_heads,)](
        qkv, norm, k_scale, v_scale, qkv.shape[0], qkv.stride(0),
        qkv.shape[1] - 2 * num_kv_heads * head_dim, eps, HEADROOM / FP8_MAX,
        NUM_KV_HEADS=num_kv_heads, HALF=head_dim // 2, HAS_NORM=k_norm_weight is not None,
        TOKENS=_TOKENS, num_warps=4,
    )  # fmt: skip
