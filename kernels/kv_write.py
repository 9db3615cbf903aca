"""Triton KV write: scatter new tokens' keys and values into the paged caches."""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp8_round import round_to_e4m3


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_scale_ptr,  # [Hkv] fp32 when FP8
    v_scale_ptr,
    stride_kt,
    stride_vt,
    stride_cache_slot,
    ROW: tl.constexpr,  # Hkv * D: one token's elements, contiguous in both input and cache
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    FP8: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:  # padding token: nothing to write
        return
    offs = tl.arange(0, BLOCK)
    mask = offs < ROW
    k = tl.load(key_ptr + token * stride_kt + offs, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + offs, mask=mask)
    dst = slot * stride_cache_slot + offs
    if FP8:  # x / scale, saturated, rounded to nearest even: kernels.kv_quant.quantize
        head = offs // HEAD_DIM
        k_s = tl.load(k_scale_ptr + head, mask=mask, other=1.0)
        v_s = tl.load(v_scale_ptr + head, mask=mask, other=1.0)
        k = round_to_e4m3(tl.clamp(tl.math.div_rn(k.to(tl.float32), k_s), -448.0, 448.0))
        v = round_to_e4m3(tl.clamp(tl.math.div_rn(v.to(tl.float32), v_s), -448.0, 448.0))
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """In-place scatter of key/value [N, Hkv, D] to k_cache/v_cache [blocks, bs, Hkv, D];
    fp8 caches store x / scale per head (scales [Hkv] fp32)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    row = num_kv_heads * head_dim
    # Each token's [Hkv, D] must be one contiguous row in the inputs and in the caches.
    key = key if key.stride(1) == head_dim and key.stride(2) == 1 else key.contiguous()
    value = value if value.stride(1) == head_dim and value.stride(2) == 1 else value.contiguous()
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "KV caches must be contiguous"
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        slot_mapping if k_scale is None else k_scale,  # unused unless FP8
        slot_mapping if v_scale is None else v_scale,
        key.stride(0),
        value.stride(0),
        row,
        ROW=row,
        HEAD_DIM=head_dim,
        BLOCK=triton.next_power_of_2(row),
        FP8=k_scale is not None,
        num_warps=4,
    )
