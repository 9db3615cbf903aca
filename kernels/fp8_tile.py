"""fp8 (e4m3) KV tiles for kernels/decode_attention_fp8.py: where a sequence's tiles begin,
loading a tile of K and V rows (one block id a page when tiles are whole pages), and where the
tile becomes fp16.

Fp8Convert: Triton moves tl.dot's operand layout conversion above an elementwise cast back to
the load, so with a plain `.to(tl.float16)` the fp8 tile is staged in shared memory and read
back a byte at a time in the mma layout (V, whose tokens are the dot's K dimension, cannot use
ldmatrix on 8-bit data on sm_90). `f16_at_load` converts in the load's layout through inline
PTX marked impure, which the layout pass does not move or copy: the fp16 tile is staged
instead and read with ldmatrix (sm_90 SASS, ops/fp8_compile_check: no LDS.U8, ~30% fewer
instructions per KV byte, fewer registers).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import enum

import triton
import triton.language as tl


class Fp8Convert(enum.Enum):
    """Where the fp8 decode kernel turns its K and V tiles into fp16 (module docstring)."""

    AT_DOT = "at_dot"  # `.to(tl.float16)`: Triton places it (at the mma's byte reads)
    V_AT_LOAD = "v_at_load"  # V through f16_at_load, K as AT_DOT
    KV_AT_LOAD = "kv_at_load"  # both through f16_at_load


@triton.jit
def f16_at_load(x8):
    """fp16 of an fp8 (e4m3) tile, converted where it was loaded (exact: e4m3 fits fp16): four
    codes a 32-bit word, two cvt.rn.f16x2.e4m3x2. CUDA only (the interpreter runs no PTX)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
        "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r",
        [x8.to(tl.uint8, bitcast=True)],
        dtype=tl.float16,
        is_pure=False,  # pinned: the layout pass moves and duplicates pure ops only
        pack=4,
    )


@triton.jit
def _load_one(cache_ptr, slots, kv_head, offs_d, d_mask, n_mask, stride_slot,
              HEAD_DIM: tl.constexpr):  # fmt: skip
    """The fp8 rows of `slots` for kv_head, as bytes."""
    offs = slots[:, None] * stride_slot + kv_head * HEAD_DIM + offs_d[None, :]
    return tl.load(cache_ptr + offs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)


@triton.jit
def tile_start(ctx_start, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Where a sequence's tiles begin: the page holding ctx_start when tiles are whole pages
    (load_tile masks the keys before ctx_start), else ctx_start."""
    if BLOCK_N % BLOCK_SIZE == 0:
        return (ctx_start // BLOCK_SIZE) * BLOCK_SIZE
    else:
        return ctx_start


@triton.jit
def load_tile(k_cache_ptr, v_cache_ptr, bt_row, n, ctx_start, end, kv_head, offs_d, d_mask,
              stride_slot, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
              HEAD_DIM: tl.constexpr):  # fmt: skip
    """The raw fp8 K and V rows of tokens [n, n + BLOCK_N) (masked outside [ctx_start, end)),
    and the mask. Tiles of whole pages (n page-aligned: tile_start) load one block id a page,
    not one a token: fewer loads and less address arithmetic."""
    offs_n = n + tl.arange(0, BLOCK_N)
    n_mask = (offs_n < end) & (offs_n >= ctx_start)
    if BLOCK_N % BLOCK_SIZE == 0:
        PAGES: tl.constexpr = BLOCK_N // BLOCK_SIZE
        offs_p = tl.arange(0, PAGES)
        page_ids = tl.load(
            bt_row + n // BLOCK_SIZE + offs_p, mask=n + offs_p * BLOCK_SIZE < end, other=0
        ).to(tl.int64)
        slots = tl.reshape(
            page_ids[:, None] * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)[None, :], [BLOCK_N]
        )
    else:
        block_ids = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        slots = block_ids * BLOCK_SIZE + (offs_n % BLOCK_SIZE)
    k = _load_one(k_cache_ptr, slots, kv_head, offs_d, d_mask, n_mask, stride_slot, HEAD_DIM)
    v = _load_one(v_cache_ptr, slots, kv_head, offs_d, d_mask, n_mask, stride_slot, HEAD_DIM)
    return k, v, n_mask
