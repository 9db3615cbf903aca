"""The work items of the Hopper prefill kernel (kernels/prefill_hopper_kernel.py): how they are
numbered, claimed, and handed from the producer warp to the warpgroups.

An item is a tile of 128 / PACK new tokens of one sequence x PACK query heads (of one kv
head: 128 rows, 64 a warpgroup): item w is tile w // (num_heads / PACK) of the flat grid of
kernels/attention_tiles.py (sequence s's tiles from query_start_loc[s] // (128 / PACK) + s on,
so the count depends only on shapes and a CUDA graph replays any mix) for heads from
(w % (num_heads / PACK)) * PACK; a sequence's tiles that see the most keys come first.
Persistent programs claim items from a counter in a device buffer (int32: the counter, the
programs finished), from the first prefill sequence's tiles to the last sequence with rows, so
decode and padding slots are never claimed; an item's fields travel in a slot of shared memory
(two a program, as Q's buffers), read once its Q has landed (the mbarrier orders them).
"""

# Gluon kernels take untyped pointers and constexprs; @gluon.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .attention_tiles import find_seq


@gluon.jit
def _work_item(w, num_heads, qsl_ptr, seq_lens_ptr, num_seqs, first, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, PACK: gl.constexpr):  # fmt: skip
    """Work item w: its sequence, first head, new rows (start, count), prefix length, first
    row, prefix tiles, and key tiles (0: no rows, a decode's, or past every sequence)."""
    tile = w // (num_heads // PACK)
    head = (w % (num_heads // PACK)) * PACK
    seq = find_seq(qsl_ptr, num_seqs, tile, BLOCK_M)
    q_start = gl.load(qsl_ptr + seq)
    q_len = gl.load(qsl_ptr + seq + 1) - q_start
    num_tiles = gl.cdiv(q_len, BLOCK_M)
    local = tile - (q_start // BLOCK_M + seq)
    m0 = (num_tiles - 1 - local) * BLOCK_M  # a sequence's tiles that see the most keys first
    ctx_len = gl.load(seq_lens_ptr + seq) - q_len
    n_pre = gl.cdiv(ctx_len, BLOCK_N)
    n_tiles = n_pre + gl.cdiv(gl.minimum(q_len, m0 + BLOCK_M), BLOCK_N)  # causal
    if (seq < first) | (local >= num_tiles):
        n_tiles = 0
    return seq, head, q_start, q_len, ctx_len, m0, n_pre, n_tiles


@gluon.jit
def item_range(qsl_ptr, num_seqs, first, num_heads, BLOCK_M: gl.constexpr, PACK: gl.constexpr):
    """The items that can hold work: from the first prefill sequence's tiles to the end of the
    last one with new rows (padding sequences at the end have none)."""
    n_tok = gl.load(qsl_ptr + num_seqs)
    lo = first
    hi = num_seqs
    while lo < hi:  # the first sequence whose rows start at n_tok
        mid = (lo + hi) // 2
        if gl.load(qsl_ptr + mid) < n_tok:
            lo = mid + 1
        else:
            hi = mid
    start = (gl.load(qsl_ptr + first) // BLOCK_M + first) * (num_heads // PACK)
    return start, (n_tok // BLOCK_M + lo) * (num_heads // PACK)


@gluon.jit
def next_item(sched_ptr, start, end, qsl_ptr, seq_lens_ptr, num_seqs, first, num_heads,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, PACK: gl.constexpr):  # fmt: skip
    """Claims items from the counter (it counts claims from start) until one holds work:
    returns it and _work_item's fields, or end (no more)."""
    w = gl.minimum(start + gl.atomic_add(sched_ptr, 1), end)
    item = _work_item(w, num_heads, qsl_ptr, seq_lens_ptr, num_seqs, first, BLOCK_M, BLOCK_N,
                      PACK)  # fmt: skip
    while (w < end) & (item[7] == 0):  # a slot past a sequence's last tile
        w = gl.minimum(start + gl.atomic_add(sched_ptr, 1), end)
        item = _work_item(w, num_heads, qsl_ptr, seq_lens_ptr, num_seqs, first, BLOCK_M,
                          BLOCK_N, PACK)  # fmt: skip
    return w, item


@gluon.jit
def hand_over(slot, item):
    """An item's fields for the warpgroups, into the program's slot of shared memory (8
    words, read once the item's Q has landed): key tiles, head, new rows (start, count),
    prefix length, first row, prefix tiles."""
    _seq, head, q_start, q_len, ctx_len, m0, n_pre, n_tiles = item
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [1], [0])  # the producer's one warp
    i = gl.arange(0, 8, layout=layout)
    words = gl.where(i == 0, n_tiles, gl.where(i == 1, head, gl.where(i == 2, q_start, gl.where(
        i == 3, q_len, gl.where(i == 4, ctx_len, gl.where(i == 5, m0, n_pre))))))  # fmt: skip
    slot.store(words)


@gluon.jit
def _word(words, i, k):
    return gl.sum(gl.where(i == k, words, 0), axis=0)  # within a thread: it holds all 8


@gluon.jit
def handed(slots, q_full, done):
    """The warpgroups' next item from the producer once its Q has landed: hand_over's fields
    (key tiles 0: no more)."""
    qb = done % 2
    mbarrier.wait(q_full.index(qb), (done // 2) & 1)
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [4], [0])  # a warpgroup
    words = slots.index(qb).load(layout)
    i = gl.arange(0, 8, layout=layout)
    return (_word(words, i, 0), _word(words, i, 1), _word(words, i, 2), _word(words, i, 3),
            _word(words, i, 4), _word(words, i, 5), _word(words, i, 6))  # fmt: skip
