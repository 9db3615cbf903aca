"""Weights pulled into L2 by the kernel before their GEMM (issue 9: the decode GEMMs' fixed cost).

A decode GEMM of Qwen3-0.6B (4-13 MB of weights at 64-256 rows) costs 6-8 us whatever its
bytes: its first weight tiles come from DRAM only once it has launched, and few programs keep
few loads in flight. The small kernel that runs just before it (the RMSNorm before qkv and
gate_up, the SwiGLU before down) has nothing to do with those weights and finishes in ~2 us:
it can ask L2 for them first. `prefetch_l2` spreads one byte range over the programs of the
kernel it runs in, each issuing CHUNKS `cp.async.bulk.prefetch.L2.global` (sm_90: a bulk hint,
no registers, no wait); the GEMM then reads its weights from L2 (50 MB on the H200; one
projection's weights are at most 13 MB here).

ON is a constexpr: off (and always under TRITON_INTERPRET=1, which has no inline PTX), the
kernels compile as before. `prefetch_on(device)` says whether a device can take it.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl


def prefetch_on(device: torch.device) -> bool:
    """Whether kernels on `device` can issue L2 bulk prefetches (CUDA, compute capability 9+)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def prefetch_l2(base_ptr, nbytes, pid, programs, CHUNKS: tl.constexpr, ON: tl.constexpr):
    """Program `pid` of `programs` asks L2 for its share of [base_ptr, base_ptr + nbytes): CHUNKS
    pieces of a 16-byte multiple each (base_ptr a byte pointer, 16-byte aligned)."""
    if ON:
        pieces = programs.to(tl.int64) * CHUNKS
        share = ((nbytes + pieces - 1) // pieces + 15) // 16 * 16
        start = (pid.to(tl.int64) * CHUNKS + tl.arange(0, CHUNKS)) * share
        size = tl.minimum(tl.maximum(nbytes - start, 0), share).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.u32 p, $2, 0; "
            "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r",
            [base_ptr + start, size],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


def weight_bytes(weight: torch.Tensor | None, stand_in: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A weight as the (byte view, byte count) prefetch_l2 takes; for None, (stand_in, 0):
    nothing to fetch (stand_in: any tensor on the kernel's device)."""
    if weight is None:
        return stand_in.view(-1).view(torch.uint8), 0
    if not weight.is_contiguous():
        raise ValueError("prefetch_l2: the weight must be contiguous")
    return weight.view(-1).view(torch.uint8), weight.numel() * weight.element_size()


def chunks_for(nbytes: int, programs: int) -> int:
    """Pieces a program issues: ~64 KB or less each, at most 16, a power of two."""
    per_program = triton.cdiv(max(nbytes, 1), max(programs, 1))
    return min(16, triton.next_power_of_2(triton.cdiv(per_program, 65536)))
