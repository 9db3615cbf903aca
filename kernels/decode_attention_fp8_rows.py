"""Pass 1 of fp8 decode attention with the tokens as the rows of both products (the *_ROWS
variants of kernels/decode_attention_fp8.py; same arguments as decode_split_fp8_kernel).

    scores^T [BLOCK_N, G] = K [BLOCK_N, D] @ q^T [D, G]
    acc^T    [D, G]      += V^T [D, BLOCK_N] @ P^T [BLOCK_N, G]

Why: with the query heads as rows (a group of 4 padded to 16) Triton keeps q in shared memory
and reloads it into mma operand registers on every tile, about a quarter of the loop's
instructions (ops/fp8_compile_check). Here the 64+ token rows make each product a Hopper
wgmma (4 warps): its B operand (q^T, then P^T) is read from shared memory by the tensor core
itself, the converted K tile is the register A operand, and V^T is staged in shared memory
once. The price: the softmax reduces over rows, across the warps (a shared-memory exchange
per tile for the running max and sum).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from .fp8_tile import load_tile, tile_start, to_f16

_F16_MAX = tl.constexpr(65504.0)


@triton.jit
def decode_split_fp8_rows_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_out_ptr, part_lse_ptr, block_tables_ptr,
    seq_lens_ptr, num_valid_ptr, k_scale_ptr, v_scale_ptr, qk_scale, window, stride_qs,
    stride_qh, stride_os, stride_oh, stride_bt, stride_slot,
    NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr, HAS_LIMIT: tl.constexpr,
    K_MODE: tl.constexpr, V_MODE: tl.constexpr, PREFETCH: tl.constexpr,  # PREFETCH unused
    ASM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
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
    # q^T [D, G]
    q_offs = seq * stride_qs + heads[None, :] * stride_qh + offs_d[:, None]
    q_t = tl.load(q_ptr + q_offs, mask=d_mask[:, None] & g_mask[None, :], other=0.0)
    q_t = tl.clamp(q_t.to(tl.float32), -_F16_MAX, _F16_MAX).to(tl.float16)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    # the softmax sum stays per token row until the end: one cross-warp reduction, not one a tile
    l_rows = tl.zeros([BLOCK_N, BLOCK_G], dtype=tl.float32)
    acc_t = tl.zeros([BLOCK_D, BLOCK_G], dtype=tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    for n in range(start, end, BLOCK_N):
        k8, v8, cur_mask = load_tile(
            k_cache_ptr, v_cache_ptr, bt_row, n, ctx_start, end, kv_head, offs_d, d_mask,
            stride_slot, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D, K_MODE, V_MODE,
        )  # fmt: skip
        k = to_f16(k8, cur_mask, K_MODE, ASM, BLOCK_N, BLOCK_D)
        s = tl.dot(k, q_t) * qk_scale  # [BLOCK_N, BLOCK_G], fp32
        s = tl.where(cur_mask[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        l_rows = l_rows * alpha[None, :] + p
        v = to_f16(v8, cur_mask, V_MODE, ASM, BLOCK_N, BLOCK_D)
        acc_t = tl.dot(tl.trans(v), p.to(tl.float16), acc_t * alpha[None, :])
        m_i = m_new

    l_i = tl.sum(l_rows, axis=0)
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o_t = acc_t * (v_scale / l_safe)[None, :]  # [D, G]
    mask = d_mask[:, None] & g_mask[None, :]
    if NUM_SPLITS == 1:
        o_offs = seq * stride_os + heads[None, :] * stride_oh + offs_d[:, None]
        tl.store(out_ptr + o_offs, o_t.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        row = (seq * NUM_Q_HEADS + heads) * NUM_SPLITS + split  # [BLOCK_G]
        tl.store(part_out_ptr + row[None, :] * HEAD_DIM + offs_d[:, None], o_t, mask=mask)
        tl.store(part_lse_ptr + row, m_i + tl.log2(l_safe), mask=g_mask)
