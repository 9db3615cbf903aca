"""Triton gated activations from the fused gate_up projection: SwiGLU and GeGLU (Gemma).

    gate_up[t] = [ gate (I wide) | up (I wide) ]   ->   out[t] = act(gate) * up   (I wide)

act is silu, or gelu with the tanh approximation (HF's gelu_pytorch_tanh).

fp32 math, stored in the input dtype. Grid (T, ceil(I / BLOCK)).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _silu_mul_kernel(
    gate_up_ptr,
    out_ptr,
    stride_in,
    stride_out,
    INTER: tl.constexpr,
    BLOCK: tl.constexpr,
    GELU_TANH: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < INTER
    src = gate_up_ptr + row * stride_in + offs
    gate = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + INTER, mask=mask, other=0.0).to(tl.float32)
    if GELU_TANH:
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)  # sqrt(2/pi)
        # 0.5 * (1 + tanh(inner)) == sigmoid(2 * inner)
        out = gate * tl.sigmoid(2.0 * inner) * up
    else:
        out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_out + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate_up[:, :I]) * gate_up[:, I:] as a new contiguous [T, I] tensor."""
    return _gated(gate_up, gelu_tanh=False)


def gelu_tanh_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate_up[:, :I]) * gate_up[:, I:] as a new contiguous [T, I] tensor."""
    return _gated(gate_up, gelu_tanh=True)


def _gated(gate_up: torch.Tensor, *, gelu_tanh: bool) -> torch.Tensor:
    num_rows, width = gate_up.shape
    if width % 2 != 0:
        raise ValueError(f"gate_up width {width} is odd: expected [gate | up] halves")
    inter = width // 2
    gate_up = gate_up if gate_up.stride(1) == 1 else gate_up.contiguous()
    out = torch.empty(num_rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    if num_rows == 0:
        return out
    block = min(_BLOCK, triton.next_power_of_2(inter))
    _silu_mul_kernel[(num_rows, triton.cdiv(inter, block))](
        gate_up,
        out,
        gate_up.stride(0),
        out.stride(0),
        INTER=inter,
        BLOCK=block,
        GELU_TANH=gelu_tanh,
        num_warps=4,
    )
    return out
