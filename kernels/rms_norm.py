"""Triton RMSNorm with an optional fused residual add (h = x + residual; norm(h))."""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < HIDDEN
    h = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        h += tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(
            residual_out_ptr + row * stride_ro + offs,
            h.to(residual_out_ptr.dtype.element_ty),
            mask=mask,
        )
    inv_rms = tl.rsqrt(tl.sum(h * h, axis=0) / HIDDEN + eps)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + row * stride_o + offs, (h * inv_rms * w).to(out_ptr.dtype.element_ty), mask=mask
    )


def rms_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x [+ residual]) * weight, x [+ residual]) over the last dim, any leading shape.
    out, when given, is a contiguous tensor shaped like x."""
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty_like(x2) if out is None else out.view(-1, hidden)
    num_rows = x2.shape[0]
    if residual is None:
        r2 = residual_out = x2  # unused by the kernel
    else:
        r2 = residual.reshape(-1, hidden)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        residual_out = torch.empty_like(x2)
    if num_rows > 0:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(num_rows,)](
            x2,
            r2,
            weight,
            out,
            residual_out,
            x2.stride(0),
            r2.stride(0),
            out.stride(0),
            residual_out.stride(0),
            eps,
            HIDDEN=hidden,
            BLOCK=block,
            HAS_RESIDUAL=residual is not None,
            num_warps=min(16, max(1, block // 256)),
        )
    out = out.view(x.shape)
    if residual is None:
        return out, x
    return out, residual_out.view(x.shape)
