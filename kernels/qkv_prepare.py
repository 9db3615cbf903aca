"""Triton attention prologue: q/k RMSNorm, rotary and the KV-cache write in one pass over qkv.

One row of the fused projection output, per token:

    qkv[t] = [ q head 0 | ... | q head Hq-1 | k head 0 | ... | k head Hkv-1 | v head 0 | ... ]
             each head D wide, halves [x1 | x2] paired by rotary (j with j + D/2)

Grid (T, 2): program (t, 0) normalises and rotates token t's q heads into the new q tensor;
program (t, 1) does the same for its k heads and copies its v heads, both straight into the
paged caches at slot_mapping[t] (slot < 0: padding, nothing written). Norm and rotary stay in
fp32 between the two steps; only the stored result is rounded.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp8_round import round_to_e4m3


@triton.jit
def _norm_rope_heads(
    src_ptr,
    dst_ptr,
    weight_ptr,
    cos,
    sin,
    eps,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    HAS_NORM: tl.constexpr,
    scale_ptr=None,  # [NUM_HEADS] fp32 when QUANT: dst holds x / scale (fp8)
    QUANT: tl.constexpr = False,
):
    """NUM_HEADS consecutive heads (D apart) from src to dst: optional RMSNorm, then rotary."""
    half = HEAD_DIM // 2
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < half
    mask = (offs_h < NUM_HEADS)[:, None] & d_mask[None, :]
    offs = offs_h[:, None].to(tl.int64) * HEAD_DIM + offs_d[None, :]
    x1 = tl.load(src_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src_ptr + offs + half, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        sum_sq = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
        inv_rms = tl.rsqrt(sum_sq / HEAD_DIM + eps)[:, None]
        w1 = tl.load(weight_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        w2 = tl.load(weight_ptr + half + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        x1 = x1 * inv_rms * w1[None, :]
        x2 = x2 * inv_rms * w2[None, :]
    out_ty = dst_ptr.dtype.element_ty
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    if QUANT:
        s = tl.load(scale_ptr + offs_h, mask=offs_h < NUM_HEADS, other=1.0)[:, None]
        # IEEE division and e4m3 rounding in fp32: every backend rounds as the CPU path
        y1 = round_to_e4m3(tl.clamp(tl.math.div_rn(y1, s), -448.0, 448.0))
        y2 = round_to_e4m3(tl.clamp(tl.math.div_rn(y2, s), -448.0, 448.0))
    tl.store(dst_ptr + offs, y1.to(out_ty), mask=mask)
    tl.store(dst_ptr + offs + half, y2.to(out_ty), mask=mask)


@triton.jit
def _prepare_qkv_kernel(
    qkv_ptr,
    q_norm_ptr,
    k_norm_ptr,
    positions_ptr,
    cache_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_scale_ptr,
    v_scale_ptr,
    stride_qkv,
    stride_cos_sin,
    eps,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_KV_ROW: tl.constexpr,
    HAS_NORM: tl.constexpr,
    FP8: tl.constexpr,
    KEEP_K: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    is_kv = tl.program_id(1) == 1
    q_size = NUM_Q_HEADS * HEAD_DIM
    kv_size = NUM_KV_HEADS * HEAD_DIM
    half = HEAD_DIM // 2
    row_ptr = qkv_ptr + token * stride_qkv
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < half
    cos_ptr = cache_ptr + pos * stride_cos_sin + offs_d
    cos = tl.load(cos_ptr, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cos_ptr + half, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    if is_kv:
        slot = tl.load(slot_ptr + token).to(tl.int64)
        if slot >= 0:  # slot < 0: padding token, its KV is never stored (its q still is)
            dst = slot * kv_size
            _norm_rope_heads(
                row_ptr + q_size,
                k_cache_ptr + dst,
                k_norm_ptr,
                cos,
                sin,
                eps,
                NUM_KV_HEADS,
                HEAD_DIM,
                BLOCK_KH,
                BLOCK_HALF,
                HAS_NORM,
                k_scale_ptr,
                FP8,
            )
            offs = tl.arange(0, BLOCK_KV_ROW)
            mask = offs < kv_size
            v = tl.load(row_ptr + q_size + kv_size + offs, mask=mask)
            if FP8:
                v_s = tl.load(v_scale_ptr + offs // HEAD_DIM, mask=mask, other=1.0)
                v = round_to_e4m3(tl.clamp(tl.math.div_rn(v.to(tl.float32), v_s), -448.0, 448.0))
            tl.store(v_cache_ptr + dst + offs, v.to(v_cache_ptr.dtype.element_ty), mask=mask)
        if KEEP_K:  # what the cache got back into k's columns (read before written); an fp8
            # cache's units (x / scale on e4m3's grid) in v's too, exact in 16 bits
            _norm_rope_heads(
                row_ptr + q_size, row_ptr + q_size, k_norm_ptr, cos, sin, eps, NUM_KV_HEADS,
                HEAD_DIM, BLOCK_KH, BLOCK_HALF, HAS_NORM, k_scale_ptr, FP8,
            )  # fmt: skip
            if FP8:
                offs = tl.arange(0, BLOCK_KV_ROW)
                mask = offs < kv_size
                v = tl.load(row_ptr + q_size + kv_size + offs, mask=mask).to(tl.float32)
                v_s = tl.load(v_scale_ptr + offs // HEAD_DIM, mask=mask, other=1.0)
                v = round_to_e4m3(tl.clamp(tl.math.div_rn(v, v_s), -448.0, 448.0))
                tl.store(
                    row_ptr + q_size + kv_size + offs, v.to(qkv_ptr.dtype.element_ty), mask=mask
                )
    else:
        _norm_rope_heads(
            row_ptr,
            q_out_ptr + token * q_size,
            q_norm_ptr,
            cos,
            sin,
            eps,
            NUM_Q_HEADS,
            HEAD_DIM,
            BLOCK_QH,
            BLOCK_HALF,
            HAS_NORM,
        )


def prepare_qkv_triton(
    qkv: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    keep_k: bool = False,
) -> torch.Tensor:
    """q [T, Hq, D] (new, contiguous, qkv's dtype) from qkv [T, (Hq + 2*Hkv) * D]; k and v go
    to the caches [blocks, block_size, Hkv, D] at slot_mapping [T]. Hkv and D come from the
    cache shape; q/k norm runs when both weights are given. keep_k: the normed, rotated k also
    replaces qkv's k columns in place (kernels/extend_attention.py reads it there); with an fp8
    cache both k's and v's columns get the cache's units (x / scale, rounded to e4m3)."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    num_tokens, width = qkv.shape
    num_q_heads = width // head_dim - 2 * num_kv_heads
    if width % head_dim != 0 or num_q_heads <= 0:
        raise ValueError(
            f"qkv width {width} is not (Hq + 2 * {num_kv_heads}) * {head_dim} "
            "for the cache's num_kv_heads and head_dim"
        )
    assert head_dim % 2 == 0, f"rotary needs an even head_dim, got {head_dim}"
    assert cos_sin_cache.shape[1] == head_dim, (
        f"cos_sin_cache has {cos_sin_cache.shape[1]} columns, head_dim is {head_dim}"
    )
    assert (q_norm_weight is None) == (k_norm_weight is None), "pass both q/k norm weights or none"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "KV caches must be contiguous"
    assert not keep_k or qkv.stride(1) == 1, "keep_k writes into qkv: its rows must be dense"
    qkv = qkv if qkv.stride(1) == 1 else qkv.contiguous()
    cache = cos_sin_cache if cos_sin_cache.stride(1) == 1 else cos_sin_cache.contiguous()
    q = torch.empty(num_tokens, num_q_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return q
    has_norm = q_norm_weight is not None and k_norm_weight is not None
    _prepare_qkv_kernel[(num_tokens, 2)](
        qkv,
        q_norm_weight if has_norm else qkv,  # unused without norm: any pointer will do
        k_norm_weight if has_norm else qkv,
        positions,
        cache,
        q,
        k_cache,
        v_cache,
        slot_mapping,
        slot_mapping if k_scale is None else k_scale,  # unused unless FP8
        slot_mapping if v_scale is None else v_scale,
        qkv.stride(0),
        cache.stride(0),
        eps,
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_QH=triton.next_power_of_2(num_q_heads),
        BLOCK_KH=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        BLOCK_KV_ROW=triton.next_power_of_2(num_kv_heads * head_dim),
        HAS_NORM=has_norm,
        FP8=k_scale is not None,
        KEEP_K=keep_k,
        num_warps=4,
    )
    return q
