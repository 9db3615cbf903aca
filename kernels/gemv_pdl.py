"""Programmatic dependent launch (PDL) for the decode GEMVs (issue 16).

A decode step is a chain of short GEMVs (Llama-8B int4: 129 kernels of 8-60 MB of weights,
~2-14 us each at full speed), so each kernel's ramp-up, tail and the launch gap between two
kernels are a large share. The weights do not depend on the kernel before; only x does. A GEMV
launched with PDL (Triton's launch_pdl=True: cuLaunchKernelEx with programmatic stream
serialization) may start while the previous kernel finishes:

    pdl_start     griddepcontrol.launch_dependents at the top: the next kernel may launch
                  once every program of this one has passed it (a hint; without it the next
                  one launches when this one ends)
    (first tile)  the first weight tile, its scales and biases are loaded: weights, written by
                  nobody
    pdl_wait      griddepcontrol.wait: blocks until the previous kernel has completed and its
                  writes are visible. Nothing earlier kernels write (x) is read, and nothing
                  they may read is written (our output, perhaps memory they read before the
                  allocator handed it to us), before it. The kernels peel their loop's first
                  iteration: its weights, the wait, its x; then the loop over the rest.

Everything sits behind a constexpr PDL (pdl_mode): OFF compiles to exactly the PTX the kernel
had without this module (ops/gemv_pdl_check.py checks); TRITON_INTERPRET=1 (the CPU), which
has no form of the griddepcontrol ops, runs PEEL: the peeled loop, no griddepcontrol.
A kernel after a PDL one that was launched normally (the split-K sum, attention) waits for its
end as ever; a PDL one after a normal one launches when that one ends (no early trigger).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .sm_count import capability

OFF, PEEL, GDC = 0, 1, 2  # the kernels' PDL constexpr


def pdl_mode(pdl: bool, device: torch.device) -> int:
    """A GEMV's PDL constexpr for a config's `pdl` on `device`: GDC (a CUDA device of compute
    capability 9.0 or more: griddepcontrol is sm_90 PTX; launch with launch_pdl=True), PEEL
    elsewhere (the peeled loop without the griddepcontrol ops: what TRITON_INTERPRET=1 tests
    on the CPU), OFF without pdl (the kernel as before)."""
    if not pdl:
        return OFF
    if capability(device)[0] >= 9:
        return GDC
    return PEEL


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """Let the next kernel launch (GDC only)."""
    if PDL == 2:
        gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the previous kernel to complete, its writes visible (GDC only)."""
    if PDL == 2:
        gdc_wait()
