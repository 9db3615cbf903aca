"""Arrival counters for the kernels whose last program to finish merges the others' partials
(split-K decode attention, MLA decode, the int4 and fp8 GEMVs): each program writes its
partial, then counts itself in with an acq_rel atomic; the one that finds the count at
splits - 1 merges in a fixed order (the result does not depend on timing) and sets the
counter back to zero. Also how many K splits a GEMV takes (k_splits, gemv_grid)."""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sm_count import num_sms

_COUNTERS: dict[torch.device, torch.Tensor] = {}
# Every counter buffer ever handed out stays alive: a captured CUDA graph keeps its pointer.
_KEEP: list[torch.Tensor] = []


def arrival_counters(size: int, device: torch.device) -> torch.Tensor:
    """A zeroed int32 buffer of at least `size` counters for `device`, reused across launches
    (the kernels leave it zeroed); one stream per device uses it at a time."""
    have = _COUNTERS.get(device)
    if have is None or have.numel() < size:
        have = torch.zeros(max(size, 1 << 16), dtype=torch.int32, device=device)
        _COUNTERS[device] = have
        _KEEP.append(have)
    return have


@triton.jit
def reset_arrival(count_ptr):
    """The last arrival sets its counter back to zero for the next launch (a graph replay).
    Relaxed: the launch boundary, or griddepcontrol.wait under PDL, orders it before any next
    use; acq_rel would hold the program on a MEMBAR.GPU until its output stores land."""
    tl.atomic_xchg(count_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def store_or_merge(
    y, out_ptr, part_ptr, counter_ptr, m, M, N, cols, col_ok, pid_n, pid_k, splits,
    SPLIT: tl.constexpr,
):  # fmt: skip
    """A split-K GEMV program's end: y (fp32, columns `cols` of row m) into out [M, N], or
    (SPLIT) into the partials [splits, M, N], the last split to arrive summing them in split
    order into out; its counter: one per (row, column block), grid axis 0 the column blocks.
    A launch of the SPLIT form at one split stores y (`splits` is known at run time only: the
    launches of one step share the compiled kernel, docs/benchmarks.md, session 43)."""
    split = False
    if SPLIT:
        split = splits > 1
    if split:
        tl.store(part_ptr + (pid_k.to(tl.int64) * M + m) * N + cols, y, mask=col_ok)
        tl.debug_barrier()  # every thread's partials are written before the (release) count
        count_ptr = counter_ptr + m * tl.num_programs(0) + pid_n
        done = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
        if done == splits - 1:
            tl.debug_barrier()
            total = tl.zeros(y.shape, dtype=tl.float32)
            for k in range(0, splits):
                at = part_ptr + (k * M + m).to(tl.int64) * N + cols
                total += tl.load(at, mask=col_ok, other=0.0, cache_modifier=".cg")
            out = out_ptr + m.to(tl.int64) * N + cols
            tl.store(out, total.to(out_ptr.dtype.element_ty), mask=col_ok)
            reset_arrival(count_ptr)
    else:
        tl.store(out_ptr + m.to(tl.int64) * N + cols, y.to(out_ptr.dtype.element_ty), mask=col_ok)


def split_buffers(
    split: int, m: int, n: int, col_blocks: int, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """out [M, N] in x's dtype, fp32 partials [split, M, N] (empty at one split) and the
    counters for store_or_merge (int32 at one split too: a kernel compiled SPLIT on holds the
    atomics that a launch at one split skips)."""
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    part = torch.empty(split if split > 1 else 0, m, n, dtype=torch.float32, device=x.device)
    return out, part, arrival_counters(m * col_blocks, x.device)


def k_splits(chunks: int, tiles: int, waves: int, device: torch.device) -> int:
    """K splits (whole chunks each, dividing them) so tiles x splits is about `waves` programs
    per SM; on the CPU two, so the tests cover the partial sums."""
    if device.type != "cuda":
        return min(chunks, 2)
    split = max(1, min(chunks, waves * num_sms(device) // max(1, tiles)))
    while chunks % split:
        split -= 1
    return split


def gemv_grid(
    m: int, n: int, chunks: int, units: int, block_n: int, waves: int, device: torch.device
) -> tuple[int, int, int, int]:
    """A split-K decode GEMV's launch (the column-layout int4 and fp8 ones) over `chunks` of
    `units` each along K: its columns per program (halved while they do not divide N, down
    to 128: whole blocks keep the 16-byte loads), column blocks, splits and units per split."""
    while n % block_n and block_n > 128:
        block_n //= 2
    col_blocks = triton.cdiv(n, block_n)
    split = k_splits(chunks, m * col_blocks, waves, device)
    per_split = triton.cdiv(chunks, split) * units
    return block_n, col_blocks, triton.cdiv(chunks * units, per_split), per_split
