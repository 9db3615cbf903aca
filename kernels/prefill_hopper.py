"""Prefill attention for Hopper in Gluon: TMA loads by a producer warp, one partition per
warpgroup, FlashAttention-3's schedule (issue 9's prefill point).

The extend kernel's contract (kernels/extend_attention.py: a chunk's keys are its cached
prefix, read through the block table, and its new tokens' keys, read from the fused qkv rows)
written for sm_90 with what Triton's own language does not express:

    producer (1 warp)   Q by TMA, then each key tile's K and V into STAGES-deep rings, each
                        slot on its own mbarrier; prefix tiles page by page through the block
                        table, new-key tiles as one bulk copy of BLOCK_N rows
    warpgroup 0 and 1   64 query rows each, no CTA barrier between them: S_j issued, then
                        P_{j-1} V_{j-1}; tile j's softmax runs while P V is on the tensor
                        cores; slots released by arrives. PINGPONG alternates the two
                        warpgroups' turns at the tensor cores, so one's softmax runs under the
                        other's matmuls.

The tile grid is attention_tiles.py's (128 new tokens of one sequence a tile, numbered from
query_start_loc on the device) times the query heads, so a CUDA graph replays any mix.
Sequences before decode_prefix are the decode kernel's. Keys past a range's end (the next
sequence's rows, TMA's zero fill, unwritten cache slots) are masked out of the scores and, on
a partial tile, zeroed in V's slot before P V reads it (0 x NaN would not vanish).

Measured against the engine's Triton extend kernel in docs/benchmarks.md (session 44).
"""

# Gluon kernels take untyped pointers and constexprs; @gluon.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

_LOG2E = 1.4426950408889634
ROWS = 64  # a warpgroup's query rows (one wgmma M); a program holds two
BLOCK_N = 128
STAGES = 2
MAXNREG = 168  # 12 warps (the producer's warpgroup counted) x 168 = the register file


@gluon.jit
def _find_seq(qsl_ptr, num_seqs, tile, BLOCK_M: gl.constexpr):
    """The last sequence s with query_start_loc[s] // BLOCK_M + s <= tile (attention_tiles)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if gl.load(qsl_ptr + mid) // BLOCK_M + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@gluon.jit
def _load_tile(desc, cache_desc, bt_row, j, n_pre, ctx_len, new_row0, col, bar, dst,
               PAGE: gl.constexpr, SUB: gl.constexpr, BLOCK_N: gl.constexpr):  # fmt: skip
    """Key tile j into dst: a prefix tile page by page (SUB rows a copy; pages past the prefix
    repeat its last one, finite rows for masked keys), else BLOCK_N new rows in one copy."""
    mbarrier.expect(bar, desc.block_type.nbytes)
    if j < n_pre:
        last_page = (ctx_len - 1) // PAGE
        for i in gl.static_range(BLOCK_N // SUB):
            key = j * BLOCK_N + i * SUB
            page = gl.minimum(key // PAGE, last_page)
            row = gl.load(bt_row + page) * PAGE + key % PAGE
            tma.async_copy_global_to_shared(cache_desc, [row, col], bar, dst.slice(i * SUB, SUB))
    else:
        tma.async_copy_global_to_shared(desc, [new_row0 + (j - n_pre) * BLOCK_N, col], bar, dst)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, kc_desc, vc_desc, q_smem, k_ring, v_ring, bars, bt_row,
              q_row, q_col, new_row0, kv_col, n_pre, n_tiles, ctx_len, PAGE: gl.constexpr,
              SUB: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    q_bar, k_ready, k_empty, v_ready, v_empty, _ = bars
    rows: gl.constexpr = q_desc.block_type.shape[0]
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, q_col], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row + rows, q_col], q_bar, q_smem.index(1))
    for j in range(n_tiles):
        slot = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        _load_tile(k_desc, kc_desc, bt_row, j, n_pre, ctx_len, new_row0, kv_col,
                   k_ready.index(slot), k_ring.index(slot), PAGE, SUB, BLOCK_N)  # fmt: skip
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        _load_tile(v_desc, vc_desc, bt_row, j, n_pre, ctx_len, new_row0, kv_col,
                   v_ready.index(slot), v_ring.index(slot), PAGE, SUB, BLOCK_N)  # fmt: skip


@gluon.jit
def _tile_range(j, n_pre, ctx_len, q_len, BLOCK_N: gl.constexpr):
    """Tile j's first key in its own range (prefix positions or new-token indices), the range's
    end, and the shift that makes `key <= row + shift` the causal test (prefix: always)."""
    if j < n_pre:
        k0 = j * BLOCK_N
        key_end = ctx_len
        shift = 1 << 30
    else:
        k0 = (j - n_pre) * BLOCK_N
        key_end = q_len
        shift = 0
    return k0, key_end, shift


@gluon.jit
def _softmax_step(s, k0, key_end, shift, r0, rows, cols, m_i, l_i, qk_scale, BLOCK_N: gl.constexpr,
                  mma_o: gl.constexpr, p_l: gl.constexpr):  # fmt: skip
    """One key tile's online softmax on raw scores s: masks only where the tile crosses the
    diagonal or its range's end, the scale folded into exp2's argument. Returns P (wgmma's
    register operand), the output rows' factor, and the new statistics (exp2 units)."""
    if (k0 + BLOCK_N > r0 + shift) | (k0 + BLOCK_N > key_end):
        keys = k0 + cols
        visible = (keys[None, :] <= (rows + shift)[:, None]) & (keys < key_end)[None, :]
        s = gl.where(visible, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, mma_o))
    return gl.convert_layout(p.to(gl.bfloat16), p_l), alpha_o, m_new, l_i


@gluon.jit
def _zero_tail(v_slot, valid, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """V rows >= valid of a partial tile set to zero in shared memory (this warpgroup's pass;
    the other writes the same zeros), fenced for the tensor cores' read."""
    if valid < BLOCK_N:
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        v = v_slot.load(layout)
        r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
        v_slot.store(gl.where((r < valid)[:, None], v, gl.zeros_like(v)))
        fence_async_shared()


@gluon.jit
def _my_turn(turn, wg: gl.constexpr, k, PINGPONG: gl.constexpr):
    """A warpgroup issues its k-th batch of wgmma after the other issued its (k-1)-th."""
    if PINGPONG:
        mbarrier.wait(turn.index(wg), k & 1)


@gluon.jit
def _pass_turn(turn, wg: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - wg), count=1)


@gluon.jit
def _consumer(q_smem, k_ring, v_ring, bars, o_ptr, stride_ot, stride_oh, q_start, q_len,
              ctx_len, m0, head, n_pre, n_tiles, qk_scale, wg: gl.constexpr,
              HEAD_DIM: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
    """Warpgroup wg: new tokens m0 + wg * ROWS .. + ROWS against every key tile."""
    q_bar, k_ready, k_empty, v_ready, v_empty, turn = bars
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    r0 = m0 + wg * ROWS
    q = q_smem.index(wg)
    rows = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma_s))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_s))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma_s))
    l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, mma_s))
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=mma_o)
    zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=mma_s)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    _my_turn(turn, wg, 0, PINGPONG)
    s_tok = warpgroup_mma(q, k_ring.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
    _pass_turn(turn, wg, PINGPONG)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    mbarrier.arrive(k_empty.index(0), count=1)
    k0, key_end, shift = _tile_range(0, n_pre, ctx_len, q_len, BLOCK_N)
    p16, alpha_o, m_i, l_i = _softmax_step(
        s, k0, key_end, shift, r0, rows, cols, m_i, l_i, qk_scale, BLOCK_N, mma_o, p_l
    )
    for j in range(1, n_tiles + 1):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        _zero_tail(v_ring.index(prev), key_end - k0, BLOCK_N, HEAD_DIM)
        if j < n_tiles:
            mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
            _my_turn(turn, wg, j, PINGPONG)
            s_tok = warpgroup_mma(
                q, k_ring.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True
            )
            pv_tok = warpgroup_mma(p16, v_ring.index(prev), acc, is_async=True)
            _pass_turn(turn, wg, PINGPONG)
            s = warpgroup_mma_wait(1, deps=[s_tok])
            mbarrier.arrive(k_empty.index(slot), count=1)
            k0, key_end, shift = _tile_range(j, n_pre, ctx_len, q_len, BLOCK_N)
            p16, alpha_o, m_i, l_i = _softmax_step(
                s, k0, key_end, shift, r0, rows, cols, m_i, l_i, qk_scale, BLOCK_N, mma_o, p_l
            )
            acc = warpgroup_mma_wait(0, deps=[pv_tok])
            mbarrier.arrive(v_empty.index(prev), count=1)
            acc = acc * alpha_o[:, None]
        else:  # the last tile's P V
            _my_turn(turn, wg, j, PINGPONG)
            pv_tok = warpgroup_mma(p16, v_ring.index(prev), acc, is_async=True)
            _pass_turn(turn, wg, PINGPONG)
            acc = warpgroup_mma_wait(0, deps=[pv_tok])

    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, mma_o))
    o = acc / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
    r = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma_o))
    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, mma_o))
    optr = o_ptr + (q_start + r).to(gl.int64)[:, None] * stride_ot + head * stride_oh + d[None, :]
    gl.store(
        optr, o.to(o_ptr.dtype.element_ty), mask=(r < q_len)[:, None] & (d < HEAD_DIM)[None, :]
    )


@gluon.jit(do_not_specialize=["num_seqs", "stride_bt"])
def prefill_hopper_kernel(
    q_desc, k_desc, v_desc, kc_desc, vc_desc, o_ptr, block_tables_ptr, seq_lens_ptr, qsl_ptr,
    decode_prefix_ptr, num_seqs, qk_scale, stride_ot, stride_oh, stride_bt,
    HAS_PREFIX: gl.constexpr, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE: gl.constexpr,
    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
):  # fmt: skip
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = 2 * ROWS
    SUB: gl.constexpr = kc_desc.block_type.shape[0]  # cache rows a copy: min(PAGE, BLOCK_N)
    tile = gl.program_id(0)
    head = gl.program_id(1)
    seq = _find_seq(qsl_ptr, num_seqs, tile, BLOCK_M)
    first = 0
    if HAS_PREFIX:
        first = gl.load(decode_prefix_ptr)
    q_start = gl.load(qsl_ptr + seq)
    q_len = gl.load(qsl_ptr + seq + 1) - q_start
    num_tiles = gl.cdiv(q_len, BLOCK_M)
    local = tile - (q_start // BLOCK_M + seq)
    if (seq >= first) & (local < num_tiles):
        m0 = (num_tiles - 1 - local) * BLOCK_M  # the tiles that see the most keys start first
        ctx_len = gl.load(seq_lens_ptr + seq) - q_len
        n_pre = gl.cdiv(ctx_len, BLOCK_N)
        n_tiles = n_pre + gl.cdiv(gl.minimum(q_len, m0 + BLOCK_M), BLOCK_N)  # causal
        bt_row = block_tables_ptr + seq.to(gl.int64) * stride_bt
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
        k_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)  # one arrive a warpgroup
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=2)
        mbarrier.init(turn.index(0), count=1)
        mbarrier.init(turn.index(1), count=1)
        mbarrier.arrive(turn.index(0), count=1)  # warpgroup 0 issues first
        bars = (q_bar, k_ready, k_empty, v_ready, v_empty, turn)
        # fmt: off
        gl.warp_specialize(
            [(_consumer, (q_smem, k_ring, v_ring, bars, o_ptr, stride_ot, stride_oh, q_start,
                          q_len, ctx_len, m0, head, n_pre, n_tiles, qk_scale, 0, HEAD_DIM, ROWS,
                          BLOCK_N, STAGES, PINGPONG)),
             (_consumer, (q_smem, k_ring, v_ring, bars, o_ptr, stride_ot, stride_oh, q_start,
                          q_len, ctx_len, m0, head, n_pre, n_tiles, qk_scale, 1, HEAD_DIM, ROWS,
                          BLOCK_N, STAGES, PINGPONG)),
             (_producer, (q_desc, k_desc, v_desc, kc_desc, vc_desc, q_smem, k_ring, v_ring, bars,
                          bt_row, q_start + m0, head * HEAD_DIM, q_start,
                          (head // GROUP) * HEAD_DIM, n_pre, n_tiles, ctx_len, PAGE, SUB,
                          BLOCK_N, STAGES))],
            [4, 1], [240, 24],
        )
        # fmt: on


def _rows(t: torch.Tensor, rows: int) -> object:
    """A TMA descriptor over t's [rows of H heads x D] as 2-D [N, H * D], blocks [rows, D]."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dim = t.shape[-1]
    flat = t.reshape(-1, t.shape[-2], dim) if t.dim() == 4 else t
    layout = gl.NVMMASharedLayout.get_default_for([rows, dim], _GL_DTYPES[t.dtype])
    return TensorDescriptor(flat, [flat.shape[0], flat.shape[1] * dim], [flat.stride(0), 1],
                            [rows, dim], layout)  # fmt: skip


_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def hopper_prefill_ok(
    q: torch.Tensor, k_cache: torch.Tensor, new_kv: tuple[torch.Tensor, torch.Tensor],
    sliding_window: int, fp8: bool,
) -> bool:  # fmt: skip
    """Whether this kernel takes the call: an sm_90 GPU, a 16-bit cache of q's dtype, head_dim
    128, no window, no fp8 scales, rows TMA can describe (16-byte aligned, heads contiguous),
    pages of at least 8 rows (a swizzle period) that divide or are divided by BLOCK_N."""
    if not q.is_cuda or torch.cuda.get_device_capability(q.device) != (9, 0):
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
) -> torch.Tensor:
    """extend_attention_triton's prefill part (hopper_prefill_ok's cases): every sequence from
    decode_prefix on, into out."""
    num_tokens, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    k_new, v_new = new_kv
    sub = min(block_size, BLOCK_N)
    grid = (num_tokens // (2 * ROWS) + num_seqs + 1, num_q_heads)
    prefill_hopper_kernel[grid](
        _rows(q, ROWS), _rows(k_new, BLOCK_N), _rows(v_new, BLOCK_N), _rows(k_cache, sub),
        _rows(v_cache, sub), out, block_tables, seq_lens, query_start_loc,
        seq_lens if decode_prefix is None else decode_prefix, num_seqs, scale * _LOG2E,
        out.stride(0), out.stride(1), block_tables.stride(0),
        HAS_PREFIX=decode_prefix is not None, GROUP=num_q_heads // num_kv_heads,
        HEAD_DIM=head_dim, PAGE=block_size, BLOCK_N=BLOCK_N, STAGES=STAGES, PINGPONG=pingpong,
        num_warps=4, maxnreg=MAXNREG,
    )  # fmt: skip
    return out
