"""vLLM's thinking_token_budget: once a request has thought for its budget of tokens, the next
draws must take the closing tag's tokens, one a step, and then it draws freely again.

Where a request stands is read from its output at every step (nothing is kept between steps,
so a preemption, a rejected proposal or a fork changes nothing): thinking is open from the
first opening tag after the last closing tag, or from the first token when the prompt left it
open (ThinkingIds.opened) and nothing closed it; its tokens are those after that tag (another
opening tag inside thinking starts no budget of its own). Past the budget, the next
token is the closing tag's first not yet drawn (a prefix of the tag that ends the output is
drawn already). With tags of one token each (Qwen3's <think>, </think>):

    budget 3, prompt opened      a b c -> </think> forced      a b </think> -> free
    budget 0                     </think> forced at the first draw

The executor allows only that token (gpu/logit_edits.py), as vLLM's logits processor does;
the fake runner takes it too (gpu/fake_model.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from troupe.messages import SamplingParams


@dataclasses.dataclass(frozen=True, kw_only=True)
class ThinkingBudget:
    """One request's budget and tags as arrays (built once per params)."""

    budget: int
    start: np.ndarray  # int64: the opening tag's ids
    end: np.ndarray  # int64: the closing tag's ids
    opened: bool  # the prompt left thinking open


def thinking_budget(params: SamplingParams) -> ThinkingBudget | None:
    """The request's budget, or None without one (or before the tokenizer filled its ids)."""
    ids = params.thinking_ids
    if params.thinking_token_budget is None or ids is None:
        return None
    return ThinkingBudget(
        budget=params.thinking_token_budget,
        start=np.asarray(ids.start, np.int64),
        end=np.asarray(ids.end, np.int64),
        opened=ids.opened,
    )


def forced_token(budget: ThinkingBudget, output: np.ndarray) -> int | None:
    """The token the next draw must take after `output` (the request's output tokens, in
    order), or None where it draws freely."""
    since = thinking_since(output, budget.start, budget.end, opened=budget.opened)
    if since is None:
        return None
    thought = output[since:]
    drawn = _drawn_prefix(thought, budget.end)
    if len(thought) - drawn < budget.budget:
        return None
    return int(budget.end[drawn])


def thinking_since(
    tokens: np.ndarray, start: np.ndarray, end: np.ndarray, *, opened: bool
) -> int | None:
    """Where the thinking still open after `tokens` began (just after its opening tag; 0 when
    it was `opened` before them and nothing closed it), None when none is open. The first
    opening tag after the last closing one opens it: another inside it opens nothing more."""
    starts, ends = tag_ends(tokens, start), tag_ends(tokens, end)
    if len(ends):
        starts = starts[starts > ends[-1]]
    elif opened:
        return 0
    return int(starts[0]) if len(starts) else None


def tag_ends(output: np.ndarray, tag: np.ndarray) -> np.ndarray:
    """Positions just after each occurrence of `tag` in `output`, ascending."""
    size = len(output) - len(tag) + 1
    if size <= 0:
        return np.zeros(0, np.int64)
    hit = np.ones(size, bool)
    for i, token in enumerate(tag.tolist()):
        hit &= output[i : i + size] == token
    return np.flatnonzero(hit) + len(tag)


def _drawn_prefix(thought: np.ndarray, end: np.ndarray) -> int:
    """The longest proper prefix of the closing tag that `thought` ends with."""
    for size in range(min(len(end) - 1, len(thought)), 0, -1):
        if np.array_equal(thought[len(thought) - size :], end[:size]):
            return size
    return 0
