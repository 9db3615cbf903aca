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
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import enum

import torch
import triton
import triton.language as tl

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


# (K conversion, V conversion, prefetch); conversion 1: packed cast to fp16, 2: bit placement
_MODES = {
    Fp8Variant.F16_CAST: (1, 1, False),
    Fp8Variant.F16_BITS: (2, 2, False),
    Fp8Variant.MIXED: (1, 2, False),
    Fp8Variant.F16_CAST_PREFETCH: (1, 1, True),
    Fp8Variant.F16_BITS_PREFETCH: (2, 2, True),
    Fp8Variant.MIXED_PREFETCH: (1, 2, True),
}


def fp8_modes(variant: Fp8Variant) -> tuple[int, int, bool]:
    """(K conversion, V conversion, prefetch) of a variant other than BF16_DOT."""
    return _MODES[variant]


@triton.jit
def _to_f16(x, MODE: tl.constexpr):
    """fp8 e4m3 tile -> fp16: its value (MODE 1), or its value * 2^-8 (MODE 2, no cvt)."""
    if MODE == 1:
        return x.to(tl.float16)
    else:
        b = x.to(tl.uint8, bitcast=True).to(tl.uint16)
        return (((b & 0x80) << 8) | ((b & 0x7F) << 7)).to(tl.float16, bitcast=True)


@triton.jit
def _load_tile(k_cache_ptr, v_cache_ptr, bt_row, n, end, kv_head, offs_d, d_mask, stride_slot,
               BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):  # fmt: skip
    """The raw fp8 K and V rows of tokens [n, n + BLOCK_N) (masked at end), and the mask."""
    offs_n = n + tl.arange(0, BLOCK_N)
    n_mask = offs_n < end
    block_ids = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    slots = block_ids * BLOCK_SIZE + (offs_n % BLOCK_SIZE)
    kv_offs = slots[:, None] * stride_slot + kv_head * HEAD_DIM + offs_d[None, :]
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
    return k, v, n_mask


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
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # bit placement (mode 2) yields value * 2^-8: the 2^8 goes into the folded scales
    k_fold = 256.0 if K_MODE == 2 else 1.0
    v_fold = 256.0 if V_MODE == 2 else 1.0
    qk_scale = qk_scale * (tl.load(k_scale_ptr + kv_head) * k_fold)
    v_scale = tl.load(v_scale_ptr + kv_head) * v_fold
    if HAS_LIMIT:
        if seq >= tl.load(num_valid_ptr):
            return
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    ctx_start = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    chunk = tl.cdiv(tl.cdiv(seq_len - ctx_start, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = ctx_start + split * chunk
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
        k_raw, v_raw, n_mask = _load_tile(
            k_cache_ptr, v_cache_ptr, bt_row, start, end, kv_head, offs_d, d_mask, stride_slot,
            BLOCK_SIZE, BLOCK_N, HEAD_DIM,
        )  # fmt: skip
    for n in range(start, end, BLOCK_N):
        if PREFETCH:
            k8 = k_raw
            v8 = v_raw
            cur_mask = n_mask
            # the next tile's loads are in flight while this one is computed (past `end` the
            # mask is all false: no memory is touched)
            k_raw, v_raw, n_mask = _load_tile(
                k_cache_ptr, v_cache_ptr, bt_row, n + BLOCK_N, end, kv_head, offs_d, d_mask,
                stride_slot, BLOCK_SIZE, BLOCK_N, HEAD_DIM,
            )  # fmt: skip
        else:
            k8, v8, cur_mask = _load_tile(
                k_cache_ptr, v_cache_ptr, bt_row, n, end, kv_head, offs_d, d_mask, stride_slot,
                BLOCK_SIZE, BLOCK_N, HEAD_DIM,
            )  # fmt: skip
        k = _to_f16(k8, K_MODE)
        v = _to_f16(v8, V_MODE)
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
    group = num_q_heads // num_kv_heads
    k_mode, v_mode, prefetch = fp8_modes(variant)
    decode_split_fp8_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, out, part_out, part_lse, block_tables, seq_lens,
        seq_lens if num_valid is None else num_valid, k_scale, v_scale, qk_scale,
        sliding_window, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0), num_kv_heads * head_dim,
        NUM_Q_HEADS=num_q_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        NUM_SPLITS=num_splits, HAS_LIMIT=num_valid is not None,
        K_MODE=k_mode, V_MODE=v_mode, PREFETCH=prefetch,
        # tl.dot needs at least 16 rows on the GPU; the padded rows are masked off.
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
