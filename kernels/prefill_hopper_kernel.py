"""The Gluon device code of kernels/prefill_hopper.py (sm_90): a warp-specialized prefill
attention kernel. Persistent programs (one an SM) claim work items (128 rows: 128 new tokens x
a query head, or with PACK 2 64 x two heads; kernels/prefill_hopper_items.py) from a global
counter as they free up: greedy, heaviest first (causal tiles differ in cost), decode and
padding slots never claimed. A program's three partitions:

    producer (1 warp)   claims the next item that holds work and hands its fields over in a
                        slot of shared memory, released with the item's Q (two buffers: the
                        next item's lands while this one runs); then each key tile's K and V
                        into STAGES-deep rings, each slot on its own mbarrier; prefix tiles
                        page by page through the block table, new-key tiles as one bulk copy
    warpgroup 0 and 1   64 query rows each, no CTA barrier between them: S_j issued, then
                        P_{j-1} V_{j-1}; tile j's softmax runs while P V is on the tensor
                        cores; slots released by arrives. PINGPONG alternates the two
                        warpgroups' turns at the tensor cores, so one's softmax runs under the
                        other's matmuls (FlashAttention-3's schedule).

Keys past a range's end (the next sequence's rows, TMA's zero fill, unwritten cache slots) are
masked out of the scores and, on a partial tile, zeroed in V's slot before P V reads it
(0 x NaN would not vanish).
"""

# Gluon kernels take untyped pointers and constexprs; @gluon.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .prefill_hopper_items import hand_over, handed, item_range, next_item

# The producer claims the next item once it has issued the loads of this item's key tile
# n_tiles - CLAIM_LEAD: late, so that a program does not hold work it cannot start while others
# run dry (claimed at the first tile, kernel_bench's 16-mixed case lost 10%), yet with the
# claim's round trips and search under the last tile's matmuls (1, 2, 3 measured: 1 best).
CLAIM_LEAD: gl.constexpr = gl.constexpr(1)


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
def _producer(q_desc, k_desc, v_desc, kc_desc, vc_desc, q_smem, k_ring, v_ring, bars, slots,
              work, block_tables_ptr, stride_bt, sched_ptr, PAGE: gl.constexpr, SUB: gl.constexpr,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr,
              PACK: gl.constexpr):  # fmt: skip
    """One warp: claims items, hands each to the warpgroups in the program's slot with its Q
    (two buffers and slots, so the next item's land while this one runs), then each key
    tile's K and V into ring slots once both release them. The next claim is made under the
    ring's waits; n_tiles 0 in the slot ends the warpgroups' loop, and the last program out
    resets the counters for the next launch."""
    q_full, q_empty, k_ready, k_empty, v_ready, v_empty, _ = bars
    qsl_ptr, seq_lens_ptr, decode_prefix_ptr, num_seqs, num_heads = work
    first = gl.load(decode_prefix_ptr)  # loaded, not captured: see the kernel's note
    rows: gl.constexpr = q_desc.block_type.shape[0]
    head_dim: gl.constexpr = q_desc.block_type.shape[1]
    tile_m: gl.constexpr = 2 * rows // PACK  # new tokens an item
    start, end = item_range(qsl_ptr, num_seqs, first, num_heads, tile_m, PACK)
    w, item = next_item(sched_ptr, start, end, qsl_ptr, seq_lens_ptr, num_seqs, first,
                        num_heads, tile_m, BLOCK_N, PACK)  # fmt: skip
    it = 0  # key tiles so far: the rings' position
    done = 0  # items so far: the Q buffers' and slots' position
    while w < end:
        seq, head, q_start, _q_len, ctx_len, m0, n_pre, n_tiles = item
        qb = done % 2
        mbarrier.wait(q_empty.index(qb), ((done // 2) & 1) ^ 1)
        hand_over(slots.index(qb), item)
        mbarrier.expect(q_full.index(qb), 2 * q_desc.block_type.nbytes)
        for h in gl.static_range(2):  # a warpgroup's rows: the next 64 tokens, or the next head
            tma.async_copy_global_to_shared(
                q_desc, [q_start + m0 + (h * rows if PACK == 1 else 0),
                         (head + (h if PACK == 2 else 0)) * head_dim],
                q_full.index(qb), q_smem.index(2 * qb + h),
            )  # fmt: skip
        bt_row = block_tables_ptr + seq.to(gl.int64) * stride_bt
        kv_col = (head // GROUP) * head_dim
        for j in range(n_tiles):
            slot = (it + j) % STAGES
            phase = ((it + j) // STAGES) & 1
            mbarrier.wait(k_empty.index(slot), phase ^ 1)
            _load_tile(k_desc, kc_desc, bt_row, j, n_pre, ctx_len, q_start, kv_col,
                       k_ready.index(slot), k_ring.index(slot), PAGE, SUB, BLOCK_N)  # fmt: skip
            mbarrier.wait(v_empty.index(slot), phase ^ 1)
            _load_tile(v_desc, vc_desc, bt_row, j, n_pre, ctx_len, q_start, kv_col,
                       v_ready.index(slot), v_ring.index(slot), PAGE, SUB, BLOCK_N)  # fmt: skip
            if j == gl.maximum(n_tiles - CLAIM_LEAD, 0):  # see CLAIM_LEAD
                w, item = next_item(sched_ptr, start, end, qsl_ptr, seq_lens_ptr, num_seqs,
                                    first, num_heads, tile_m, BLOCK_N, PACK)  # fmt: skip
        it += n_tiles
        done += 1
    qb = done % 2
    mbarrier.wait(q_empty.index(qb), ((done // 2) & 1) ^ 1)
    slots.index(qb).store(gl.full([8], 0, gl.int32, gl.BlockedLayout([8], [32], [1], [0])))
    mbarrier.arrive(q_full.index(qb), count=1)
    if gl.atomic_add(sched_ptr + 1, 1) == gl.num_programs(0) - 1:  # every claim is made
        gl.atomic_xchg(sched_ptr, 0)
        gl.atomic_xchg(sched_ptr + 1, 0)


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
def softmax_step(s, k0, key_end, shift, r0, rows, cols, m_i, l_i, qk_scale, BLOCK_N: gl.constexpr,
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
def _attend(q, k_ring, v_ring, k_ready, k_empty, v_ready, v_empty, turn, it, kt, q_len, ctx_len,
            r0, n_pre, n_tiles, qk_scale, wg: gl.constexpr, HEAD_DIM: gl.constexpr,
            ROWS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
            PINGPONG: gl.constexpr):  # fmt: skip
    """Warpgroup wg's rows r0 .. + ROWS against the item's n_tiles key tiles, the rings at
    position it, its turns at kt: S_j and P_{j-1} V_{j-1} issued together, tile j's softmax
    under P V. Returns the unnormalised output and the row sums."""
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    rows = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma_s))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_s))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma_s))
    l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, mma_s))
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=mma_o)
    zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=mma_s)

    slot = it % STAGES
    mbarrier.wait(k_ready.index(slot), (it // STAGES) & 1)
    _my_turn(turn, wg, kt, PINGPONG)
    s_tok = warpgroup_mma(q, k_ring.index(slot).permute((1, 0)), zero, use_acc=False,
                          is_async=True)  # fmt: skip
    _pass_turn(turn, wg, PINGPONG)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    mbarrier.arrive(k_empty.index(slot), count=1)
    k0, key_end, shift = _tile_range(0, n_pre, ctx_len, q_len, BLOCK_N)
    p16, alpha_o, m_i, l_i = softmax_step(
        s, k0, key_end, shift, r0, rows, cols, m_i, l_i, qk_scale, BLOCK_N, mma_o, p_l
    )
    for j in range(1, n_tiles):
        slot = (it + j) % STAGES
        prev = (it + j - 1) % STAGES
        mbarrier.wait(k_ready.index(slot), ((it + j) // STAGES) & 1)
        mbarrier.wait(v_ready.index(prev), ((it + j - 1) // STAGES) & 1)
        _zero_tail(v_ring.index(prev), key_end - k0, BLOCK_N, HEAD_DIM)
        _my_turn(turn, wg, kt + j, PINGPONG)
        s_tok = warpgroup_mma(
            q, k_ring.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True
        )
        pv_tok = warpgroup_mma(p16, v_ring.index(prev), acc, is_async=True)
        _pass_turn(turn, wg, PINGPONG)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        mbarrier.arrive(k_empty.index(slot), count=1)
        k0, key_end, shift = _tile_range(j, n_pre, ctx_len, q_len, BLOCK_N)
        p16, alpha_o, m_i, l_i = softmax_step(
            s, k0, key_end, shift, r0, rows, cols, m_i, l_i, qk_scale, BLOCK_N, mma_o, p_l
        )
        acc = warpgroup_mma_wait(0, deps=[pv_tok])
        mbarrier.arrive(v_empty.index(prev), count=1)
        acc = acc * alpha_o[:, None]
    last = (it + n_tiles - 1) % STAGES  # the last tile's P V
    mbarrier.wait(v_ready.index(last), ((it + n_tiles - 1) // STAGES) & 1)
    _zero_tail(v_ring.index(last), key_end - k0, BLOCK_N, HEAD_DIM)
    _my_turn(turn, wg, kt + n_tiles, PINGPONG)
    pv_tok = warpgroup_mma(p16, v_ring.index(last), acc, is_async=True)
    _pass_turn(turn, wg, PINGPONG)
    acc = warpgroup_mma_wait(0, deps=[pv_tok])
    mbarrier.arrive(v_empty.index(last), count=1)
    return acc, gl.convert_layout(l_i, gl.SliceLayout(1, mma_o))


@gluon.jit
def _consumer(q_smem, k_ring, v_ring, bars, slots, o_ptr, stride_ot, stride_oh, qk_scale,
              wg: gl.constexpr, HEAD_DIM: gl.constexpr, ROWS: gl.constexpr,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
              PACK: gl.constexpr):  # fmt: skip
    """Warpgroup wg: of each item the producer hands over, rows m0 + wg * ROWS .. + ROWS of its
    head (PACK 1), or rows m0 .. + ROWS of its head + wg (PACK 2)."""
    q_full, q_empty, k_ready, k_empty, v_ready, v_empty, turn = bars
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    it = 0
    kt = 0  # turns so far: n_tiles + 1 an item
    done = 0
    n_tiles, head, q_start, q_len, ctx_len, m0, n_pre = handed(slots, q_full, done)
    while n_tiles > 0:
        qb = done % 2
        r0 = m0 + (wg * ROWS if PACK == 1 else 0)
        acc, l_o = _attend(
            q_smem.index(2 * qb + wg), k_ring, v_ring, k_ready, k_empty, v_ready, v_empty,
            turn, it, kt, q_len, ctx_len, r0, n_pre, n_tiles, qk_scale, wg, HEAD_DIM, ROWS,
            BLOCK_N, STAGES, PINGPONG,
        )  # fmt: skip
        mbarrier.arrive(q_empty.index(qb), count=1)
        o = acc / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
        r = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma_o))
        d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, mma_o))
        row = (q_start + r).to(gl.int64)[:, None] * stride_ot
        optr = o_ptr + row + (head + (wg if PACK == 2 else 0)) * stride_oh + d[None, :]
        mask = (r < q_len)[:, None] & (d < HEAD_DIM)[None, :]
        gl.store(optr, o.to(o_ptr.dtype.element_ty), mask=mask)
        it += n_tiles
        kt += n_tiles + 1
        done += 1
        n_tiles, head, q_start, q_len, ctx_len, m0, n_pre = handed(slots, q_full, done)


@gluon.jit(do_not_specialize=["num_seqs", "stride_bt"])
def prefill_hopper_kernel(
    q_desc, k_desc, v_desc, kc_desc, vc_desc, o_ptr, block_tables_ptr, seq_lens_ptr, qsl_ptr,
    decode_prefix_ptr, sched_ptr, num_seqs, qk_scale, stride_ot, stride_oh, stride_bt,
    GROUP: gl.constexpr, NUM_HEADS: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE: gl.constexpr,
    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr, PACK: gl.constexpr,
):  # fmt: skip
    """Persistent programs claim items from sched_ptr's counter (prefill_hopper_items.py; its
    counters zero at launch and left so). Sequences before decode_prefix_ptr[0] are decodes
    (point it at query_start_loc[0] == 0 for none). Scalars reach the partitions only as kernel
    arguments, loaded there: a value computed here would reach them through a shared-memory
    word that the compiler also gives the producer's atomic as scratch, which the second
    warpgroup might read too late."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    SUB: gl.constexpr = kc_desc.block_type.shape[0]  # cache rows a copy: min(PAGE, BLOCK_N)
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [4, ROWS, HEAD_DIM], q_desc.layout)  # 2 x 2 wg
    k_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    slots = gl.allocate_shared_memory(gl.int32, [2, 8], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    for i in gl.static_range(2):
        mbarrier.init(q_full.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)  # one arrive a warpgroup
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=2)
    mbarrier.arrive(turn.index(0), count=1)  # warpgroup 0 issues first
    bars = (q_full, q_empty, k_ready, k_empty, v_ready, v_empty, turn)
    work = (qsl_ptr, seq_lens_ptr, decode_prefix_ptr, num_seqs, NUM_HEADS)
    # fmt: off
    gl.warp_specialize(
        [(_consumer, (q_smem, k_ring, v_ring, bars, slots, o_ptr, stride_ot, stride_oh,
                      qk_scale, 0, HEAD_DIM, ROWS, BLOCK_N, STAGES, PINGPONG, PACK)),
         (_consumer, (q_smem, k_ring, v_ring, bars, slots, o_ptr, stride_ot, stride_oh,
                      qk_scale, 1, HEAD_DIM, ROWS, BLOCK_N, STAGES, PINGPONG, PACK)),
         (_producer, (q_desc, k_desc, v_desc, kc_desc, vc_desc, q_smem, k_ring, v_ring, bars,
                      slots, work, block_tables_ptr, stride_bt, sched_ptr, PAGE, SUB, BLOCK_N, STAGES,
                      GROUP, PACK))],
        [4, 1], [240, 24],
    )
    # fmt: on
