"""Pass 1 of paged decode attention over an fp8 (e4m3) KV cache: the kernel FP8_DEFAULT_CONFIG
(kernels/decode_attention.py) launches for every fp8 cache; pass 2, the merge of the splits, is
decode_attention's.

The per-(layer, KV head) scales are constant within a program, so nothing is scaled per
element: the K scale is folded into the score scale after QK^T, the V scale into the output
after the softmax division. The fp8 bytes become fp16 with one packed conversion per two
elements (cvt.rn.f16x2.e4m3x2) and both dots run in fp16 (q and the probabilities cast to fp16,
fp32 accumulation). e4m3 fits fp16 exactly; q is clamped to fp16's range first. (A bf16 cast
costs three conversions per two elements on sm_90, issued at a quarter of the FMA rate: near
2/3 of copy bandwidth at most.) Tiles of whole pages load one block id a page
(kernels/fp8_tile.py).

Why it stays near 70% of copy (H200 ncu + SASS, 2026-12-02): Triton moves tl.dot's layout
conversion above any chain of elementwise ops back to the load, so the fp8 tile is staged in
shared memory and read back one byte at a time (LDS.U8) in the mma operand layout, then packed
and converted: ~4.6 instructions per KV byte, 255 registers at block_n 128
(ops/fp8_compile_check shows the SASS without a GPU). The variants that tried other conversions,
register prefetch, register layouts, 32-bit word loads or the tokens as rows lost on the H200
and were removed; their figures are in docs/benchmarks.md. DecodeConfig.fp8_convert (the
tiles converted where loaded, through PTX the layout pass cannot move: kernels/fp8_tile.py)
removes the byte reads in the SASS (0.089 warp instructions a KV byte against 0.125, 148
registers); no such form beat the default, on an H100 (82.8% of copy at best against 85.2%,
session 39) nor on an H200 (48-66% against 73.9%, session 40; docs/benchmarks.md). What held the
default on the H200 was bytes in flight: the page ids make its tile loads indirect, and Triton's
pipeliner gives those one buffer below 5 stages; FP8_DEFAULT_CONFIG now launches 64-key tiles at
5 stages (two in flight), ~83% on ops/h200_standin.py's H200 stand-in against 74% (session 46).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode_group import softmax_step
from .decode_program import program_sequence
from .fp8_tile import Fp8Convert, f16_at_load, load_tile, tile_start
from .sinks import sink_start
from .softcap import softcap_log2, softcap_raw

_F16_MAX = tl.constexpr(65504.0)  # a global a kernel reads must be a constexpr


@triton.jit(do_not_specialize=["stride_bt"])  # an eager step's block-table width varies
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
    order_ptr,  # int32 [S] when HAS_ORDER: the sequences in launch order (decode_order.py)
    k_scale_ptr,  # [Hkv] fp32
    v_scale_ptr,
    sinks_ptr,  # [Hq] when SINKS: each head's sink logit (kernels/sinks.py)
    qk_scale,  # softmax scale * log2(e)
    window,  # sliding window in tokens, 0: none
    cap,  # the scores' soft cap in log2 units when SOFTCAP (kernels/softcap.py)
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
    HAS_ORDER: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    K_AT_LOAD: tl.constexpr,  # f16_at_load for K (fp8_tile.Fp8Convert)
    V_AT_LOAD: tl.constexpr,  # and for V
    SOFTCAP: tl.constexpr,  # scores soft-capped (Gemma 2)
    SINKS: tl.constexpr,  # a learned sink per head, started from by split 0 (GPT-OSS)
):
    seq = program_sequence(order_ptr, HAS_ORDER)  # grid (kv head, position, split)
    kv_head = tl.program_id(0)
    split = tl.program_id(2)
    qk_scale = qk_scale * tl.load(k_scale_ptr + kv_head)
    v_scale = tl.load(v_scale_ptr + kv_head)
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
    m_i, l_i = sink_start(sinks_ptr, heads, g_mask & (split == 0), m_i, l_i, SINKS)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    for n in range(start, end, BLOCK_N):
        k8, v8, cur_mask = load_tile(
            k_cache_ptr, v_cache_ptr, bt_row, n, ctx_start, end, kv_head, offs_d, d_mask,
            stride_slot, BLOCK_SIZE, BLOCK_N, HEAD_DIM,
        )  # fmt: skip
        k = f16_at_load(k8) if K_AT_LOAD else k8.to(tl.float16)
        v = f16_at_load(v8) if V_AT_LOAD else v8.to(tl.float16)
        qk = tl.dot(q, tl.trans(k))  # [BLOCK_G, BLOCK_N], fp32
        if SOFTCAP:
            qk = softcap_raw(qk, qk_scale, cap)
        qk = qk * qk_scale
        m_i, l_i, acc = softmax_step(qk, cur_mask, v, m_i, l_i, acc, "tf32")  # fp16 ignores it

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
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_valid: torch.Tensor | None,
    seq_order: torch.Tensor | None,
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
    convert: Fp8Convert = Fp8Convert.AT_DOT,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> None:
    """Pass 1; with several splits it leaves pass 2 (the merge of the partials, laid out as
    decode_attention's) to the caller. `convert` applies on CUDA (the interpreter: AT_DOT)."""
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    consts = kernel_constexprs(
        num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        block_size=block_size, num_splits=num_splits, has_limit=num_valid is not None,
        has_order=seq_order is not None, block_n=block_n,
        convert=convert if q.is_cuda else Fp8Convert.AT_DOT, softcap=softcap > 0,
        sinks=sinks is not None,
    )  # fmt: skip
    decode_split_fp8_kernel[(num_kv_heads, num_seqs, num_splits)](  # decode_order.py
        q, k_cache, v_cache, out, part_out, part_lse, block_tables, seq_lens,
        seq_lens if num_valid is None else num_valid,
        seq_lens if seq_order is None else seq_order, k_scale, v_scale,
        k_scale if sinks is None else sinks, qk_scale,
        sliding_window, softcap_log2(softcap), q.stride(0), q.stride(1), out.stride(0),
        out.stride(1), block_tables.stride(0), num_kv_heads * head_dim, **consts,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip


def kernel_constexprs(
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_splits: int,
    has_limit: bool,
    block_n: int,
    has_order: bool = False,
    convert: Fp8Convert = Fp8Convert.AT_DOT,
    softcap: bool = False,
    sinks: bool = False,
) -> dict[str, object]:
    """The compile-time arguments of decode_split_fp8_kernel (also ops/fp8_compile_check's)."""
    group = num_q_heads // num_kv_heads
    return {
        "NUM_Q_HEADS": num_q_heads, "GROUP": group, "HEAD_DIM": head_dim,
        "BLOCK_SIZE": block_size, "NUM_SPLITS": num_splits, "HAS_LIMIT": has_limit,
        "HAS_ORDER": has_order,
        # tl.dot needs at least 16 rows on the GPU; the padded rows are masked off.
        "BLOCK_G": max(16, triton.next_power_of_2(group)), "BLOCK_N": block_n,
        "BLOCK_D": triton.next_power_of_2(head_dim),
        "K_AT_LOAD": convert is Fp8Convert.KV_AT_LOAD,
        "V_AT_LOAD": convert is not Fp8Convert.AT_DOT, "SOFTCAP": softcap,
        "SINKS": sinks,
    }  # fmt: skip
