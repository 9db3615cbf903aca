"""What the draft has seen of a request (gpu/draft_state.py): exact positions and tokens to
feed after prefill chunks, verifications (accepted proposals' KV reused), dropped blocks,
resets and prefix-cache starts."""

from __future__ import annotations

from troupe.gpu.draft_state import DraftSeq, DraftSeqs
from troupe.messages import SampledToken, SeqWork


def _work(pos: int, tokens: tuple[int, ...], **kw: object) -> SeqWork:
    return SeqWork(request_id="r", token_ids=tokens, start_pos=pos, **kw)  # type: ignore[arg-type]


def _round(seq: DraftSeq, proposals: tuple[int, ...]) -> None:
    """What DraftRunner does: feed every known token, write KV for all proposals but the last."""
    seq.fed(len(seq.known))
    seq.spec = proposals[:-1]


def test_chunked_prefill_then_verifications_feed_only_unseen_tokens() -> None:
    seqs = DraftSeqs(block_size=4)
    first = _work(0, (1, 2, 3, 4, 5), sample=False)
    seq = seqs.apply(first, num_blocks=2)
    assert (seq.computed, seq.known) == (0, [1, 2, 3, 4, 5])
    seq.fed(5)  # a round without proposals: the chunk's KV
    last = _work(5, (6, 7))
    seqs.commit(seqs.apply(last, num_blocks=3), last, SampledToken("r", 8))
    assert (seq.computed, seq.known) == (5, [6, 7, 8])  # the chunk and the target's token
    _round(seq, (9, 10, 11))  # KV of 6 7 8, then of proposals 9 10 at positions 8 9
    assert (seq.computed, seq.spec) == (8, (9, 10))
    # verification of 8 | 9 10 11: two accepted, then the target's 12
    verify = _work(7, (8,), draft_token_ids=(9, 10, 11))
    seqs.commit(seqs.apply(verify, num_blocks=4), verify, SampledToken("r", 9, None, (10, 12)))
    assert (seq.computed, seq.known, seq.spec) == (10, [12], ())  # 9 and 10 were in the pool
    _round(seq, (13, 14, 15))
    # all three accepted: the last proposal's KV was never written, so it is fed again
    verify = _work(10, (12,), draft_token_ids=(13, 14, 15))
    seqs.commit(seqs.apply(verify, num_blocks=5), verify, SampledToken("r", 13, None, (14, 15, 16)))
    assert (seq.computed, seq.known) == (13, [15, 16])
    _round(seq, (17, 18))
    # nothing accepted: the rejected proposal's KV is simply overwritten
    verify = _work(14, (16,), draft_token_ids=(17, 18))
    seqs.commit(seqs.apply(verify, num_blocks=5), verify, SampledToken("r", 30))
    assert (seq.computed, seq.known) == (15, [30])


def test_dropped_blocks_lose_the_proposals_kv() -> None:
    seqs = DraftSeqs(block_size=4)
    seq = seqs.apply(_work(0, (1, 2, 3, 4, 5, 6)), num_blocks=3)
    seqs.commit(seq, _work(0, (1, 2, 3, 4, 5, 6)), SampledToken("r", 7))
    _round(seq, (8, 9, 10, 11))  # KV of 7 at 6, proposals 8 9 10 at 7 8 9 (blocks 1 and 2)
    assert (seq.computed, seq.spec) == (7, (8, 9, 10))
    # the scheduler proposed nothing: Shrink to two blocks (positions 0..7), then one granted
    plain = _work(6, (7,), num_dropped_blocks=1, block_ids=(40,))
    seqs.commit(seqs.apply(plain, num_blocks=3), plain, SampledToken("r", 8))
    assert (seq.computed, seq.known) == (8, [])  # 8 at position 7 was kept, in block 1
    # no proposals were fed for 9 at position 8: its KV went with the dropped block
    seq2 = seqs.apply(_work(7, (8,)), num_blocks=3)
    seqs.commit(seq2, _work(7, (8,)), SampledToken("r", 9))
    assert (seq.computed, seq.known) == (8, [9])


def test_reset_rewinds_and_prefix_starts_are_taken_as_present() -> None:
    seqs = DraftSeqs(block_size=4)
    seq = seqs.apply(_work(8, (9, 10, 11)), num_blocks=3)  # 8 tokens from the prefix cache
    assert (seq.computed, seq.known) == (8, [9, 10, 11])
    seqs.commit(seq, _work(8, (9, 10, 11)), SampledToken("r", 12))
    _round(seq, (13, 14))
    assert (seq.computed, seq.spec) == (12, (13,))
    # recompute preemption: a new table from position 4 (one cached block)
    redo = _work(4, (5, 6, 7, 8, 9, 10, 11, 12), reset=True, sample=False)
    seqs.apply(redo, num_blocks=4)
    assert (seq.computed, seq.known, seq.spec) == (4, [5, 6, 7, 8, 9, 10, 11, 12], ())
    # a swap-in (reset at the sequence's end) keeps what the draft has
    seq.fed(8)
    swapped_in = _work(12, (13,), reset=True)
    seqs.apply(swapped_in, num_blocks=4)
    assert (seq.computed, seq.known) == (12, [13])
    seqs.release(("r",))
    assert not seqs.by_id


def test_declined_proposals_pause_the_drafts_for_that_request() -> None:
    """The scheduler planned a decode without the proposals offered for it (paused, or a step
    it keeps from proposing): no proposals for the next backoff_steps rounds, then again."""
    seqs = DraftSeqs(block_size=4, backoff_steps=2)
    seq = seqs.apply(_work(0, (1, 2, 3)), num_blocks=2)
    assert seqs.wants(seq)
    seq.offered = True  # the round after the prefill proposed
    used = _work(3, (4,), draft_token_ids=(5, 6))
    seqs.apply(used, num_blocks=2)
    assert seqs.wants(seq) and not seq.offered  # verified: keep proposing
    seq.offered = True
    seqs.apply(_work(4, (5,)), num_blocks=2)  # declined
    assert not seqs.wants(seq)
    seqs.apply(_work(5, (6,)), num_blocks=3)
    assert not seqs.wants(seq)
    seqs.apply(_work(6, (7,)), num_blocks=3)
    assert seqs.wants(seq)  # offers again after two rounds
    seq.offered = True
    seqs.apply(_work(7, (8,)), num_blocks=3)  # declined again: twice as long
    assert seq.skip == 4
    for pos in range(8, 12):
        seqs.apply(_work(pos, (pos + 1,)), num_blocks=4)
    assert seqs.wants(seq)
    seq.offered = True
    seqs.apply(_work(12, (13,), draft_token_ids=(14,)), num_blocks=4)  # used: back to short
    assert seq.declines == 0
    # a chunk that does not sample, or proposals not offered, change nothing
    seqs.apply(_work(13, (14,), sample=False), num_blocks=4)
    seqs.apply(_work(14, (15,)), num_blocks=4)
    assert seqs.wants(seq)
