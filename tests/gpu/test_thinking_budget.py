"""gpu/thinking_budget.py: where a request stands, read from its output at each step (the
token the next draw must take, or none), and the tokenizer's reading of tags and prompt; the
executor's edits allow only that token (gpu/logit_edits.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.actors.core.tokenizer_params import with_thinking
from troupe.gpu.logit_edits import apply_logit_edits, build_logit_edits, request_edits
from troupe.gpu.thinking_budget import ThinkingBudget, forced_token
from troupe.messages import ParamError, SamplingParams, ThinkingIds

OPEN, CLOSE = [7], [8, 9]  # a one-token opening tag, a two-token closing one


def _forced(budget: int, opened: bool, *output: int) -> int | None:
    state = ThinkingBudget(budget=budget, start=tuple(OPEN), end=tuple(CLOSE), opened=opened)
    return forced_token(state, np.array(output, np.int64))


@pytest.mark.parametrize(
    ("budget", "opened", "output", "forced"),
    [
        (3, True, (), None),
        (3, True, (1, 2), None),
        (3, True, (1, 2, 3), 8),  # spent: the tag's first token
        (3, True, (1, 2, 3, 8), 9),  # ... then its next
        (3, True, (1, 2, 3, 8, 9), None),  # closed: free
        (0, True, (), 8),  # no thinking at all
        (3, False, (1, 2, 3, 4), None),  # never opened
        (3, False, (1, 7, 2, 3), None),  # opened in the output: its own tokens count
        (3, False, (1, 7, 2, 3, 4), 8),
        (2, True, (1, 8, 9, 7, 5), None),  # closed, opened again: a budget of its own
        (2, True, (1, 8, 9, 7, 5, 6), 8),
        (3, True, (1, 8), None),  # the tag's first token drawn by itself: not thinking
        (3, True, (1, 8, 2, 3), 8),
    ],
)
def test_where_a_request_stands(
    budget: int, opened: bool, output: tuple[int, ...], forced: int | None
) -> None:
    assert _forced(budget, opened, *output) == forced


def test_a_walk_never_thinks_past_its_budget() -> None:
    """Random draws over a vocabulary holding the tags, taking the forced token where there
    is one: every thinking block closes after at most budget + len(CLOSE) - 1 tokens (a
    prefix of the tag the model drew itself counts only once the rest follows), and the one
    the walk ends in is that long or closing."""
    rng = np.random.default_rng(0)
    limit = len(CLOSE) - 1
    for _ in range(300):
        budget, opened = int(rng.integers(0, 5)), bool(rng.integers(0, 2))
        out: list[int] = []
        for _ in range(40):
            drawn = _forced(budget, opened, *out)
            out.append(int(rng.integers(1, 10)) if drawn is None else drawn)
        inside, run = opened, 0
        for i, token in enumerate(out):
            if inside and out[i : i + len(CLOSE)] == CLOSE:
                assert run <= budget + limit, (budget, opened, out, i)
                inside = False
            elif inside:
                run += 1
            elif token == OPEN[0]:
                inside, run = True, 0
        assert not inside or run <= budget + 2 * limit, (budget, opened, out)


def test_the_edits_allow_only_the_forced_token() -> None:
    ids = ThinkingIds(start=tuple(OPEN), end=tuple(CLOSE), opened=True)
    params = SamplingParams(
        thinking_token_budget=1, thinking_tags=("a", "b"), thinking_ids=ids, logit_bias={3: 5.0}
    )
    edit = request_edits(params, eos_token_ids=[0])
    assert edit is not None and edit.reads_history
    history = np.array([4, 4, 1, 8], np.int64)  # two prompt tokens, then 1, 8
    for end, expected in ((2, None), (3, 8), (4, 9)):
        built = build_logit_edits(
            [edit], np.array([end - 2]), torch.device("cpu"), [history], np.array([end])
        )
        assert built is not None
        logits = apply_logit_edits(torch.zeros(1, 12), built)[0]
        if expected is None:  # free: only the bias
            assert torch.isfinite(logits).all() and logits[3] == 5.0
        else:
            assert torch.isfinite(logits).nonzero().flatten().tolist() == [expected]


def test_the_tokenizer_reads_tags_and_prompt() -> None:
    tok = load_tokenizer()
    tags = ("<think>", "</think>")
    start, end = (tuple(tok.encode(tag, False)) for tag in tags)
    params = SamplingParams(thinking_token_budget=5, thinking_tags=tags)
    for prompt, opened in (
        ("Hi<think>\n", True),
        ("Hi<think>x</think>\n", False),
        ("Hi", False),
        ("<think>a</think><think>b", True),
    ):
        ids = with_thinking(tok, params, tok.encode(prompt, False)).thinking_ids
        assert ids == ThinkingIds(start=start, end=end, opened=opened), prompt
    forced = SamplingParams(thinking_token_budget=5, thinking_tags=tags, thinking_from_start=True)
    assert with_thinking(tok, forced, tok.encode("Hi", False)).thinking_ids.opened  # type: ignore[union-attr]
    planted = SamplingParams(thinking_ids=ThinkingIds(start=(1,), end=(2,)))
    assert with_thinking(tok, planted, [5]).thinking_ids is None  # a client's own ids: dropped


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (
            SamplingParams(thinking_token_budget=-1, thinking_tags=("a", "b")),
            "thinking_token_budget",
        ),
        (SamplingParams(thinking_tags=("a", " ")), "thinking_tags"),
        (SamplingParams(thinking_ids=ThinkingIds(start=(), end=(1,))), "thinking_tags"),
        (SamplingParams(thinking_ids=ThinkingIds(start=(1,), end=(99,))), "thinking_tags"),
    ],
)
def test_bad_thinking_fields_are_named(params: SamplingParams, field: str) -> None:
    with pytest.raises(ParamError) as info:
        params.check(vocab_size=50)
    assert info.value.field == field
