"""gpu/thinking_budget.py's scan kept between steps: at every step of random walks (outputs
that grow a token or a long run at a time, proposals past the settled tokens that are then
rejected, rewrites that make it forget) the token forced with the scan is the one a full read
of the output forces; and the executor's request states forget a scan whose tokens are
written again."""

from __future__ import annotations

import numpy as np
import pytest
from troupe.gpu.request_states import RequestStates
from troupe.gpu.thinking_budget import ThinkingBudget, ThinkingScan, forced_token
from troupe.messages import SamplingParams, SeqWork, ThinkingIds


@pytest.mark.parametrize(
    ("start", "end"), [((7,), (8,)), ((7, 3), (8, 9)), ((1, 2, 3), (3, 4, 5, 6)), ((5,), (5, 6))]
)
def test_the_scan_forces_what_a_full_read_forces(start: tuple[int, ...], end: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(start) * 31 + len(end))
    vocab = sorted({*start, *end, 10, 11})
    for _ in range(40):
        budget = ThinkingBudget(
            budget=int(rng.integers(0, 12)), start=start, end=end, opened=bool(rng.integers(0, 2))
        )
        scan, settled = ThinkingScan(), []
        for _ in range(80):
            roll = rng.random()
            if roll < 0.1 and settled:  # a rewrite from some position: forget
                del settled[int(rng.integers(0, len(settled))) :]
                scan.forget()
            if roll > 0.95:  # a long run at once (a history moved in): numpy's read
                settled += [int(rng.choice(vocab)) for _ in range(int(rng.integers(65, 150)))]
            proposals = [int(rng.choice(vocab)) for _ in range(int(rng.integers(0, 4)))]
            forced = []
            for k in range(len(proposals) + 1):  # a row per proposal, as verification has
                output = np.array(settled + proposals[:k], np.int64)
                want = forced_token(budget, output)
                assert forced_token(budget, output, scan, len(settled)) == want, (
                    budget,
                    output.tolist(),
                    k,
                )
                forced.append(want)
            settled.append(int(rng.choice(vocab)) if forced[0] is None else forced[0])


def test_the_scan_reads_only_what_came_after_it() -> None:
    budget = ThinkingBudget(budget=3, start=(7,), end=(8,), opened=False)
    scan = ThinkingScan()
    output = np.array([1, 7, 2, 8, 1, 1], np.int64)
    assert forced_token(budget, output, scan, 6) is None
    assert (scan.upto, scan.last_end, scan.first_start) == (6, 4, 0)
    more = np.array([*output.tolist(), 7, 2, 2, 2], np.int64)  # opened again: 3 thought
    assert forced_token(budget, more, scan, 10) == 8
    assert (scan.upto, scan.last_end, scan.first_start) == (10, 4, 7)


def test_request_states_forget_a_scan_whose_tokens_are_rewritten() -> None:
    ids = ThinkingIds(start=(7,), end=(8,), opened=False)
    params = SamplingParams(thinking_token_budget=2, thinking_tags=("a", "b"), thinking_ids=ids)
    states = RequestStates(max_model_len=64, max_blocks_per_seq=8, block_size=8, new_seed=lambda: 1)
    prompt = (3, 3, 3)
    work = SeqWork("r", prompt, 0, block_ids=(0,), params=params, num_prompt_tokens=3)
    (state,) = states.apply((work,))
    (state,) = states.apply((SeqWork("r", (7, 1, 1), 3),))
    edits = state.edits
    assert edits is not None and edits.scan is not None and edits.thinking is not None
    scan = edits.scan
    assert state.tokens is not None
    output = state.tokens[3 : state.num_tokens]
    forced_token(edits.thinking, output, scan, 3)
    assert scan.upto == 3 and scan.first_start == 1
    states.apply((SeqWork("r", (1,), 6),))  # the next position: kept
    assert scan.upto == 3
    states.apply((SeqWork("r", (2, 2), 5),))  # position 5 (output 2) written again
    assert scan.upto == 0 and scan.first_start == 0
