"""fp8 (e4m3) KV tiles for kernels/decode_attention_fp8.py: where a sequence's tiles begin and
loading a tile of K and V rows, one block id a page when tiles are whole pages.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl


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
