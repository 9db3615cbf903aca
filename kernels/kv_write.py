"""Triton KV write: scatter new tokens' keys and values into the paged caches."""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_vt,
    stride_cache_slot,
    ROW: tl.constexpr,  # Hkv * D: one token's elements, contiguous in both input and cache
    BLOCK: tl.constexpr,
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
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """In-place scatter of key/value [N, Hkv, D] to k_cache/v_cache [blocks, bs, Hkv, D]."""
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
        key.stride(0),
        value.stride(0),
        row,
        ROW=row,
        BLOCK=triton.next_power_of_2(row),
        num_warps=4,
    )
