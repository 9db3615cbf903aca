"""Prefill attention for Hopper in Gluon (issue 9's prefill point): the extend kernel's contract
(kernels/extend_attention.py: a chunk's keys are its cached prefix, read through the block
table, and its new tokens' keys, read from the fused qkv rows) on sm_90 with what Triton's own
language does not express: TMA loads by a producer warp, one partition per warpgroup,
FlashAttention-3's schedule, persistent programs that claim work as they free up
(kernels/prefill_hopper_kernel.py).

hopper_prefill_ok says which calls it takes (bf16, head_dim 128, no window or fp8 cache);
extend_attention_triton routes them here. Sequences before decode_prefix are the decode
kernel's. Measured against the Triton extend kernel in docs/benchmarks.md (session 44).
"""

from __future__ import annotations

import functools

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .prefill_hopper_kernel import prefill_hopper_kernel
from .sm_count import capability, num_sms

_LOG2E = 1.4426950408889634
ROWS = 64  # a warpgroup's query rows (one wgmma M); a program holds two
BLOCK_N = 128
STAGES = 2
MAXNREG = 168  # 12 warps (the producer's warpgroup counted) x 168 = the register file


@functools.cache
def _layout(rows: int, dim: int) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for([rows, dim], gl.bfloat16)


@functools.cache
def _sched(device: torch.device) -> torch.Tensor:
    """The kernel's claim counter and finished-program count. The kernel leaves both at zero,
    so one buffer serves every launch on the device's stream. Made at the first call, which
    must be eager: made under a graph capture, it would hold whatever the memory held until
    the graph's first replay."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "prefill_attention_hopper: the first call on a device must run outside CUDA graph "
            "capture (warm up eagerly first)"
        )
    return torch.zeros(2, dtype=torch.int32, device=device)


def _rows(t: torch.Tensor, rows: int) -> object:
    """A TMA descriptor over t's bf16 [rows of H heads x D] as 2-D [N, H * D], blocks [rows, D]."""
    dim = t.shape[-1]
    flat = t.reshape(-1, t.shape[-2], dim) if t.dim() == 4 else t
    return TensorDescriptor(flat, [flat.shape[0], flat.shape[1] * dim], [flat.stride(0), 1],
                            [rows, dim], _layout(rows, dim))  # fmt: skip


def hopper_prefill_ok(
    q: torch.Tensor, k_cache: torch.Tensor, new_kv: tuple[torch.Tensor, torch.Tensor],
    sliding_window: int, fp8: bool,
) -> bool:  # fmt: skip
    """Whether this kernel takes the call: an sm_90 GPU, bf16 values and cache, head_dim
    128, no window, no fp8 scales, rows TMA can describe (16-byte aligned, heads contiguous),
    pages of at least 8 rows (a swizzle period) that divide or are divided by BLOCK_N."""
    if capability(q.device) != (9, 0):
        return False
    block_size = k_cache.shape[1]
    views = (q, *new_kv)
    return (
        q.dtype == torch.bfloat16
        and k_cache.dtype == q.dtype
        and q.shape[-1] == 128
        and sliding_window == 0
        and not fp8
        and k_cache.is_contiguous()
        and 8 <= block_size
        and (block_size % BLOCK_N == 0 or BLOCK_N % block_size == 0)
        and all(t.stride(1) == t.shape[2] and t.stride(2) == 1 for t in views)
        and all((t.stride(0) * 2) % 16 == 0 and t.data_ptr() % 16 == 0 for t in views)
    )


def prefill_attention_hopper(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    new_kv: tuple[torch.Tensor, torch.Tensor],
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    decode_prefix: torch.Tensor | None = None,
    *,
    pingpong: bool = True,
    pack: int | None = None,
) -> torch.Tensor:
    """extend_attention_triton's prefill part (hopper_prefill_ok's cases): every sequence from
    decode_prefix on, into out: one program an SM, each claiming the next item (a tile x a
    head, heaviest first within a sequence) as it frees up. docs/benchmarks.md (session 45) has
    what this and the forms before it (a fixed stride, a program an item) measured. pack 2
    (GQA only; None: 2 where the group is even): an item is 64 tokens x two query heads of one
    kv head, whose keys and values one load serves, and short chunks fill twice the rows. H100
    (session 46): a verification's 256 x (1,000 + 5) 659 -> 431 us, 16 mixed 103 -> 97 us, the
    long prefills within 1% of pack 1."""
    num_tokens, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    if pack is None:
        pack = 2 if group % 2 == 0 else 1
    if pack not in (1, 2) or group % pack:
        raise ValueError(f"pack: 1, or 2 where query heads pair within a kv head; got {pack} "
                         f"with {group} query heads a kv head")  # fmt: skip
    num_seqs = seq_lens.shape[0]
    k_new, v_new = new_kv
    sub = min(block_size, BLOCK_N)
    total = (num_tokens // (2 * ROWS // pack) + num_seqs + 1) * (num_q_heads // pack)  # items
    grid = (min(total, num_sms(q.device)),)  # shapes only: graph-safe
    sched = _sched(q.device)
    prefill_hopper_kernel[grid](
        _rows(q, ROWS), _rows(k_new, BLOCK_N), _rows(v_new, BLOCK_N), _rows(k_cache, sub),
        _rows(v_cache, sub), out, block_tables, seq_lens, query_start_loc,
        query_start_loc if decode_prefix is None else decode_prefix, sched, num_seqs,
        scale * _LOG2E,
        out.stride(0), out.stride(1), block_tables.stride(0),
        GROUP=group, NUM_HEADS=num_q_heads, HEAD_DIM=head_dim, PAGE=block_size,
        BLOCK_N=BLOCK_N, STAGES=STAGES, PINGPONG=pingpong, PACK=pack, num_warps=4,
        maxnreg=MAXNREG,
    )  # fmt: skip
    return out
