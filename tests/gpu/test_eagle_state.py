"""What an EAGLE head is fed per step (gpu/eagle_state.py), driven by hand-built SeqWork and
SampledToken: row p reads the token at p + 1 and the step's hidden row of p; a chunk's last
row waits for the next chunk; a verification feeds t and the accepted proposals; a gap or a
recompute restarts at start_pos."""

from __future__ import annotations

import torch
from troupe.gpu.eagle_state import EagleSeqs
from troupe.messages import SampledToken, SeqWork

HIDDEN = torch.arange(40, dtype=torch.float32)[:, None].repeat(1, 2)  # row r holds r


def test_chunks_wait_for_the_next_token_then_decodes_and_verifications() -> None:
    seqs = EagleSeqs()
    chunk = SeqWork("r", (10, 11, 12), 0, sample=False)
    feed = seqs.feed(chunk, None, 0, HIDDEN)
    assert (feed.start, feed.token_ids, feed.pending) == (0, (11, 12), None)
    assert feed.seq.computed == 2 and feed.seq.pending is not None
    assert feed.seq.pending.tolist() == [2.0, 2.0]  # the chunk's last row (row 2 of the step)
    # the last chunk samples 20: the waiting row (position 2) reads 13, the chunk's first
    last = SeqWork("r", (13, 14), 3)
    feed = seqs.feed(last, SampledToken("r", 20), 5, HIDDEN)
    assert (feed.start, feed.token_ids, feed.first_row) == (2, (13, 14, 20), 5)
    assert feed.pending is not None and feed.pending.tolist() == [2.0, 2.0]
    assert (feed.seq.computed, feed.seq.pending, feed.num_committed) == (5, None, 6)
    # a verification of 20, d1 d2 d3 at 5..8: d1 d2 accepted, 31 the target's own
    verify = SeqWork("r", (20,), 5, draft_token_ids=(21, 22, 23))
    feed = seqs.feed(verify, SampledToken("r", 21, more=(22, 31)), 0, HIDDEN)
    assert (feed.start, feed.token_ids, feed.pending, feed.first_row) == (5, (21, 22, 31), None, 0)
    assert (feed.seq.computed, feed.num_committed) == (8, 9)


def test_gaps_and_recomputes_restart_at_start_pos() -> None:
    seqs = EagleSeqs()
    hit = SeqWork("r", (5, 6), 8)  # the first 8 positions from the prefix cache
    feed = seqs.feed(hit, SampledToken("r", 7), 0, HIDDEN)
    assert (feed.start, feed.token_ids, feed.seq.computed) == (8, (6, 7), 10)
    again = SeqWork("r", (1, 2, 3), 0, reset=True, sample=False)  # recomputed from 0
    feed = seqs.feed(again, None, 0, HIDDEN)
    assert (feed.start, feed.token_ids, feed.seq.computed) == (0, (2, 3), 2)
    skipped = SeqWork("r", (9,), 6)  # rows 2..5 never fed: taken as present
    feed = seqs.feed(skipped, SampledToken("r", 4), 0, HIDDEN)
    assert (feed.start, feed.token_ids, feed.pending, feed.seq.computed) == (6, (4,), None, 7)
    seqs.release(("r",))
    assert not seqs.by_id
