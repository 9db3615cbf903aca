"""Pass 1 of paged decode attention over an fp8 (e4m3) KV cache: the variants beside the shared
kernel of kernels/decode_attention.py (variant BF16_DOT), which the benchmark compares.

The per-(layer, KV head) scales are constant within a program, so no variant scales per
element: the K scale is folded into the score scale after QK^T, the V scale into the output
after the softmax division. What differs is how the bytes become tensor-core operands:

- BF16_DOT (decode_attention's kernel): fp8 -> bf16 per element. On sm_90 that is three
  conversions per two elements (e4m3x2 -> f16x2, then f16 -> bf16 twice), issued at a quarter
  of the FMA rate: the conversions alone cap it near 2/3 of copy bandwidth.
- F16_CAST: fp8 -> fp16 with one packed conversion per two elements (cvt.rn.f16x2.e4m3x2);
  both dots in fp16 (q and the probabilities cast to fp16, fp32 accumulation). e4m3 fits fp16
  exactly; q is clamped to fp16's range first.
- F16_BITS: no conversion instruction: an e4m3 byte s.eeee.mmm placed as the fp16 bit pattern
  s.0eeee.mmm0000000 is the same value times 2^-8 (subnormals included, both formats being
  IEEE-like with 3 vs 10 mantissa bits), so two integer ops and a bitcast give it; the 2^8 is
  folded into the scales. Integer ops run at 4x the conversion rate.
- MIXED: K by the packed conversion, V by bit placement: the two share the work between the
  conversion and the integer pipes.

Every variant can also PREFETCH: the next tile's fp8 bytes are loaded into registers before the
current tile is computed (a tile of 64 tokens is 64 bytes a thread per cache with 4 warps), for
num_stages=1 launches where Triton's own pipeliner (one shared buffer per stage) is off.

Why the above stay near 70% of copy (H200 ncu + SASS, 2026-12-02): Triton moves tl.dot's layout
conversion above any chain of elementwise ops back to the load, so the fp8 tile is staged in
shared memory and read back one byte at a time (LDS.U8) in the mma operand layout, then packed
and converted: ~4.6 instructions per KV byte, 255 registers at block_n 128. The register-layout
variants stop that (ops/fp8_compile_check shows their SASS without a GPU):

- REG_CAST: F16_CAST with a select after the cast (a select stops the move): the cast runs on
  the 16 bytes a thread loaded and the fp16 tile reaches tl.dot through shared memory (ldmatrix,
  the bf16 path). No LDS.U8; byte repacking (PRMT) remains.
- WORD_BITS: K and V loaded as uint32 words (4 fp8 each), expanded by 32-bit integer ops (two
  bytes per op into fp16 bit patterns, value * 2^-8) and assembled by tl.join + reshape. Triton
  then stages K's raw words through shared memory straight into the operand layout (one byte of
  shared traffic per element) and V as fp16 (ldmatrix.trans); ~100 registers at block_n 64.
- WORD_CVT: WORD_BITS with the hardware's packed cvt.rn.f16x2.e4m3x2 (inline PTX, two per
  word) instead of the integer ops; under the interpreter (no PTX) it takes WORD_BITS' path.
- WORD_MIXED: K as REG_CAST, V as WORD_BITS.
- *_ROWS (kernels/decode_attention_fp8_rows.py): the tokens as rows of both products, so they
  are Hopper wgmmas whose B operands (q^T, P^T) the tensor core reads from shared memory: no
  per-tile reload of the padded query tile into registers (a quarter of WORD_CVT's loop).
  WORD_CVT_ROWS: ~0.085-0.096 loop instructions a KV byte against F16_CAST's 0.125.

The word variants need 16-byte aligned head rows (head_dim a multiple of 16); for other caches
launch_split_fp8 runs F16_CAST instead (words_fit). Tile loads and conversions:
kernels/fp8_tile.py.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import enum

import torch
import triton
import triton.language as tl

from .decode_attention_fp8_rows import decode_split_fp8_rows_kernel
from .fp8_tile import load_tile, tile_start, to_f16

_F16_MAX = tl.constexpr(65504.0)  # a global a kernel reads must be a constexpr


class Fp8Variant(enum.Enum):
    """How the decode kernel turns fp8 KV into tensor-core operands (module doc)."""

    BF16_DOT = "bf16_dot"
    F16_CAST = "f16_cast"
    F16_BITS = "f16_bits"
    MIXED = "mixed"
    F16_CAST_PREFETCH = "f16_cast_prefetch"
    F16_BITS_PREFETCH = "f16_bits_prefetch"
    MIXED_PREFETCH = "mixed_prefetch"
    REG_CAST = "reg_cast"
    WORD_BITS = "word_bits"
    WORD_MIXED = "word_mixed"
    WORD_BITS_PREFETCH = "word_bits_prefetch"
    WORD_CVT = "word_cvt"
    WORD_CVT_PREFETCH = "word_cvt_prefetch"
    WORD_CVT_ROWS = "word_cvt_rows"
    WORD_BITS_ROWS = "word_bits_rows"
    F16_CAST_ROWS = "f16_cast_rows"


# (K conversion, V conversion, prefetch); conversion 1: packed cast to fp16, 2: bit placement,
# 3: packed cast kept in the load layout, 4: bit placement on 32-bit words (that cache's tile
# loaded as uint32 words, 4 fp8 each: see _load_one), 5: words converted by the packed cvt in
# inline PTX (bit placement under the interpreter)
_MODES = {
    Fp8Variant.F16_CAST: (1, 1, False),
    Fp8Variant.F16_BITS: (2, 2, False),
    Fp8Variant.MIXED: (1, 2, False),
    Fp8Variant.F16_CAST_PREFETCH: (1, 1, True),
    Fp8Variant.F16_BITS_PREFETCH: (2, 2, True),
    Fp8Variant.MIXED_PREFETCH: (1, 2, True),
    Fp8Variant.REG_CAST: (3, 3, False),
    Fp8Variant.WORD_BITS: (4, 4, False),
    Fp8Variant.WORD_MIXED: (3, 4, False),
    Fp8Variant.WORD_BITS_PREFETCH: (4, 4, True),
    Fp8Variant.WORD_CVT: (5, 5, False),
    Fp8Variant.WORD_CVT_PREFETCH: (5, 5, True),
    Fp8Variant.WORD_CVT_ROWS: (5, 5, False),
    Fp8Variant.WORD_BITS_ROWS: (4, 4, False),
    Fp8Variant.F16_CAST_ROWS: (1, 1, False),
}
_ROWS = (Fp8Variant.WORD_CVT_ROWS, Fp8Variant.WORD_BITS_ROWS, Fp8Variant.F16_CAST_ROWS)


def fp8_modes(variant: Fp8Variant) -> tuple[int, int, bool]:
    """(K conversion, V conversion, prefetch) of a variant other than BF16_DOT."""
    return _MODES[variant]


@triton.jit
def decode_split_fp8_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,  # [S, Hq, D] when NUM_SPLITS == 1
    part_out_ptr,  # [S, Hq, NUM_SPLITS, D] fp32 otherwise
    part_lse_ptr,  # [S, Hq, NUM_SPLITS] fp32
    block_tables_ptr,
    seq_lens_ptr,
    num_valid_ptr,  # int32 [1] when HAS_LIMIT: sequences from this one on are skipped
    k_scale_ptr,  # [Hkv] fp32
    v_scale_ptr,
    qk_scale,  # softmax scale * log2(e)
    window,  # sliding window in tokens, 0: none
    stride_qs,
    stride_qh,
    stride_os,
    stride_oh,
    stride_bt,
    stride_slot,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HAS_LIMIT: tl.constexpr,
    K_MODE: tl.constexpr,
    V_MODE: tl.constexpr,
    PREFETCH: tl.constexpr,
    ASM: tl.constexpr,  # inline PTX allowed (not under the interpreter)
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # bit placement (modes 2, 4; 5 without ASM) yields value * 2^-8: the 2^8 goes into the
    # folded scales
    k_fold = 256.0 if K_MODE == 2 or K_MODE == 4 or (K_MODE == 5 and not ASM) else 1.0
    v_fold = 256.0 if V_MODE == 2 or V_MODE == 4 or (V_MODE == 5 and not ASM) else 1.0
    qk_scale = qk_scale * (tl.load(k_scale_ptr + kv_head) * k_fold)
    v_scale = tl.load(v_scale_ptr + kv_head) * v_fold
    if HAS_LIMIT:
        if seq >= tl.load(num_valid_ptr):
            return
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    ctx_start = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    lo = tile_start(ctx_start, BLOCK_SIZE, BLOCK_N)
    chunk = tl.cdiv(tl.cdiv(seq_len - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g
    q_offs = seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    q = tl.clamp(q.to(tl.float32), -_F16_MAX, _F16_MAX).to(tl.float16)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    if PREFETCH:
        k_raw, v_raw, n_mask = load_tile(
            k_cache_ptr, v_cache_ptr, bt_row, start, ctx_start, end, kv_head, offs_d, d_mask,
            stride_slot, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D, K_MODE, V_MODE,
        )  # fmt: skip
    for n in range(start, end, BLOCK_N):
        if PREFETCH:
            k8 = k_raw
            v8 = v_raw
            cur_mask = n_mask
            # the next tile's loads are in flight while this one is computed (past `end` the
            # mask is all false: no memory is touched)
            k_raw, v_raw, n_mask = load_tile(
                k_cache_ptr, v_cache_ptr, bt_row, n + BLOCK_N, ctx_start, end, kv_head, offs_d,
                d_mask, stride_slot, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D, K_MODE, V_MODE,
            )  # fmt: skip
        else:
            k8, v8, cur_mask = load_tile(
                k_cache_ptr, v_cache_ptr, bt_row, n, ctx_start, end, kv_head, offs_d, d_mask,
                stride_slot, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D, K_MODE, V_MODE,
            )  # fmt: skip
        k = to_f16(k8, cur_mask, K_MODE, ASM, BLOCK_N, BLOCK_D)
        v = to_f16(v8, cur_mask, V_MODE, ASM, BLOCK_N, BLOCK_D)
        qk = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_G, BLOCK_N], fp32
        qk = tl.where(cur_mask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc * (v_scale / l_safe)[:, None]
    if NUM_SPLITS == 1:
        o_offs = seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(
            out_ptr + o_offs, o.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :]
        )
    else:
        row = (seq * NUM_Q_HEADS + heads) * NUM_SPLITS + split  # [BLOCK_G]
        tl.store(
            part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
            o,
            mask=g_mask[:, None] & d_mask[None, :],
        )
        tl.store(part_lse_ptr + row, m_i + tl.log2(l_safe), mask=g_mask)


def launch_split_fp8(
    variant: Fp8Variant,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_valid: torch.Tensor | None,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    qk_scale: float,
    sliding_window: int,
    num_splits: int,
    *,
    block_n: int,
    block_d: int,
    num_warps: int,
    num_stages: int,
) -> None:
    """Pass 1 with `variant`; with several splits it leaves pass 2 (the merge of the partials,
    laid out as decode_attention's) to the caller."""
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if max(fp8_modes(variant)[:2]) >= 4 and not words_fit(k_cache, v_cache):
        variant = Fp8Variant.F16_CAST  # the byte loads serve any head_dim
    consts = kernel_constexprs(
        variant, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        block_size=block_size, num_splits=num_splits, has_limit=num_valid is not None,
        block_n=block_n, inline_asm=q.is_cuda,
    )  # fmt: skip
    kernel_for(variant)[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, out, part_out, part_lse, block_tables, seq_lens,
        seq_lens if num_valid is None else num_valid, k_scale, v_scale, qk_scale,
        sliding_window, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0), num_kv_heads * head_dim, **consts,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip


def words_fit(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether the word variants (modes 4, 5: 16-byte loads of 4 words) can read these caches:
    every head's row 16-byte aligned. Otherwise launch_split_fp8 runs F16_CAST instead."""
    head_dim = k_cache.shape[-1]
    return head_dim % 16 == 0 and k_cache.data_ptr() % 16 == 0 and v_cache.data_ptr() % 16 == 0


def kernel_for(variant: Fp8Variant) -> triton.JITFunction:
    """The Triton kernel that runs `variant` (all take the same arguments)."""
    return decode_split_fp8_rows_kernel if variant in _ROWS else decode_split_fp8_kernel


def kernel_constexprs(
    variant: Fp8Variant,
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_splits: int,
    has_limit: bool,
    block_n: int,
    inline_asm: bool = True,
) -> dict[str, object]:
    """The compile-time arguments of kernel_for(variant) (also ops/fp8_compile_check's)."""
    group = num_q_heads // num_kv_heads
    k_mode, v_mode, prefetch = fp8_modes(variant)
    if max(k_mode, v_mode) >= 4 and head_dim % 16:
        raise ValueError(
            f"head_dim={head_dim}: {variant.value} reads 16-byte words (multiple of 16)"
        )
    return {
        "NUM_Q_HEADS": num_q_heads, "GROUP": group, "HEAD_DIM": head_dim,
        "BLOCK_SIZE": block_size, "NUM_SPLITS": num_splits, "HAS_LIMIT": has_limit,
        "K_MODE": k_mode, "V_MODE": v_mode, "PREFETCH": prefetch, "ASM": inline_asm,
        # tl.dot needs at least 16 rows on the GPU; the padded rows are masked off.
        "BLOCK_G": max(16, triton.next_power_of_2(group)), "BLOCK_N": block_n,
        "BLOCK_D": triton.next_power_of_2(head_dim),
    }  # fmt: skip
