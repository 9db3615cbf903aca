"""fp8 (e4m3) KV tiles for the decode kernels: loading a tile of K and V rows (bytes, or 32-bit
words of 4 fp8 each) and turning it into fp16 (kernels/decode_attention_fp8.py's modes).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def to_f16(x, n_mask, MODE: tl.constexpr, ASM: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_D: tl.constexpr):  # fmt: skip
    """fp8 e4m3 tile -> fp16 [BLOCK_N, BLOCK_D]: its value (MODES 1, 3, 5 with ASM), or its
    value * 2^-8 (MODES 2, 4, 5 without ASM: no cvt; the kernel folds 2^8 into the scales).
    MODES 4 and 5 take the tile as [BLOCK_N, BLOCK_D // 4] 32-bit words."""
    if MODE == 1:
        return x.to(tl.float16)
    elif MODE == 2:
        b = x.to(tl.uint8, bitcast=True).to(tl.uint16)
        return (((b & 0x80) << 8) | ((b & 0x7F) << 7)).to(tl.float16, bitcast=True)
    elif MODE == 3:
        # a select after the cast: Triton does not move a layout conversion above a select, so
        # the cast runs where the load put the bytes (16 in a row per thread: packed cvts) and
        # tl.dot's operand layout is reached through shared memory in fp16 (ldmatrix), instead
        # of the fp8 bytes being read from shared memory one at a time in the operand layout
        return tl.where(n_mask[:, None], x.to(tl.float16), 0.0)
    elif MODE == 5 and ASM:
        # two hardware conversions per word (cvt.rn.f16x2.e4m3x2 on each 16-bit half): exact
        # values, the word's byte i in half i of the pair it lands in
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.rn.f16x2.e4m3x2 $0, l; "
            "cvt.rn.f16x2.e4m3x2 $1, h; }",
            "=r,=r,r", [x], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1,
        )  # fmt: skip
        return _words_to_tile(lo, hi, BLOCK_N, BLOCK_D)
    else:
        # MODE 4 (and 5 where inline PTX cannot run: the interpreter): bytes b0..b3 of a word
        # to bits 0-7, 16-23 of two words (b0, b1 and b2, b3), then per 16-bit lane (b << 7)
        # with its sign bit (now bit 14) carried up to bit 15 by adding it again:
        # s.eeee.mmm -> s.0eeee.mmm0000000, the fp16 pattern of value * 2^-8
        lo = (x & 0xFF) | ((x & 0xFF00) << 8)
        hi = ((x >> 16) & 0xFF) | ((x >> 8) & 0xFF0000)
        lo = lo << 7
        hi = hi << 7
        lo = lo + (lo & 0x40004000)
        hi = hi + (hi & 0x40004000)
        return _words_to_tile(lo, hi, BLOCK_N, BLOCK_D)


@triton.jit
def _words_to_tile(lo, hi, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """[BLOCK_N, BLOCK_D // 4] pairs of fp16 (word w's elements 0, 1 in lo, 2, 3 in hi, low half
    first) -> the [BLOCK_N, BLOCK_D] fp16 tile. Joins and a reshape, not a layout: Triton
    picks the load layout so that the tile lands where tl.dot wants it."""
    e0 = (lo & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
    e1 = (lo >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
    e2 = (hi & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
    e3 = (hi >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
    # element 4w + i of the row is e_i of word w
    return tl.reshape(tl.join(tl.join(e0, e2), tl.join(e1, e3)), [BLOCK_N, BLOCK_D])


@triton.jit
def _load_one(cache_ptr, slots, kv_head, offs_d, d_mask, n_mask, stride_slot, MODE: tl.constexpr,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """The fp8 rows of `slots` for kv_head: bytes, or 32-bit words for MODE 4."""
    if MODE >= 4:
        offs_w = tl.arange(0, BLOCK_D // 4)
        # rows start 16-byte aligned (head_dim and the slot stride are multiples of 16 bytes:
        # the launcher checks), which lets each thread's 4 words be one 16-byte load
        row = tl.multiple_of((slots * stride_slot + kv_head * HEAD_DIM) // 4, 4)
        words = cache_ptr.to(tl.pointer_type(tl.uint32))
        mask = n_mask[:, None] & (offs_w < HEAD_DIM // 4)[None, :]
        return tl.load(words + row[:, None] + offs_w[None, :], mask=mask, other=0)
    else:
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
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, K_MODE: tl.constexpr,
              V_MODE: tl.constexpr):  # fmt: skip
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
    k = _load_one(k_cache_ptr, slots, kv_head, offs_d, d_mask, n_mask, stride_slot, K_MODE,
                  HEAD_DIM, BLOCK_D)  # fmt: skip
    v = _load_one(v_cache_ptr, slots, kv_head, offs_d, d_mask, n_mask, stride_slot, V_MODE,
                  HEAD_DIM, BLOCK_D)  # fmt: skip
    return k, v, n_mask
