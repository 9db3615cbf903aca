"""vLLM's thinking_token_budget: once a request has thought for its budget of tokens, the next
draws must take the closing tag's tokens, one a step, and then it draws freely again.

Where a request stands is read from its output: thinking is open from the first opening tag
after the last closing tag, or from the first token when the prompt left it open
(ThinkingIds.opened) and nothing closed it; its tokens are those after that tag (another
opening tag inside thinking starts no budget of its own). Past the budget, the next
token is the closing tag's first not yet drawn (a prefix of the tag that ends the output is
drawn already). With tags of one token each (Qwen3's <think>, </think>):

    budget 3, prompt opened      a b c -> </think> forced      a b </think> -> free
    budget 0                     </think> forced at the first draw

The executor allows only that token (gpu/logit_edits.py), as vLLM's logits processor does;
the fake runner takes it too (gpu/fake_model.py).

So that a step does not read a long output again, the executor keeps a `ThinkingScan` per
request: where things stood after the output tokens that can no longer change (those before
the request's num_tokens; proposals after them may be rejected). A step reads only the tokens
after it, the tags' lengths less one before it included (a tag may straddle the line); a
rewrite of any token it read (gpu/request_states.py: a preemption's reset, a history moved in,
a plan that rewrites by position) forgets it. Windows of a few tokens are read in Python
(numpy's calls cost more than the few comparisons), longer ones with numpy.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from troupe.messages import SamplingParams

_SMALL = 64  # windows up to this many tokens are read in Python


@dataclasses.dataclass(frozen=True, kw_only=True)
class ThinkingBudget:
    """One request's budget and tags (built once per params)."""

    budget: int
    start: tuple[int, ...]  # the opening tag's ids
    end: tuple[int, ...]  # the closing tag's ids
    opened: bool  # the prompt left thinking open


@dataclasses.dataclass
class ThinkingScan:
    """Where thinking stood after a request's first `upto` output tokens (the module
    docstring): positions just after a tag, 0 for none."""

    upto: int = 0
    last_end: int = 0  # the last closing tag in them
    first_start: int = 0  # the first opening tag that ends after last_end

    def forget(self) -> None:
        """A token it read was rewritten: read from the start again."""
        self.upto = self.last_end = self.first_start = 0


def thinking_budget(params: SamplingParams) -> ThinkingBudget | None:
    """The request's budget, or None without one (or before the tokenizer filled its ids)."""
    ids = params.thinking_ids
    if params.thinking_token_budget is None or ids is None:
        return None
    return ThinkingBudget(
        budget=params.thinking_token_budget,
        start=tuple(ids.start),
        end=tuple(ids.end),
        opened=ids.opened,
    )


def forced_token(
    budget: ThinkingBudget,
    output: np.ndarray,
    scan: ThinkingScan | None = None,
    settled: int = 0,
) -> int | None:
    """The token the next draw must take after `output` (the request's output tokens, in
    order), or None where it draws freely. `scan`: where things stood after its first
    scan.upto tokens, moved on to the first `settled` (those that cannot change)."""
    num = len(output)
    if num < budget.budget:  # fewer tokens than the budget: none thought past it
        return None
    scan = ThinkingScan() if scan is None else scan
    settled = min(settled, num)
    if settled < scan.upto:  # never so where every rewrite forgets; read all again
        scan.forget()
    if settled > scan.upto:
        state = (scan.last_end, scan.first_start)
        scan.last_end, scan.first_start = _advance(budget, output, state, scan.upto, settled)
        scan.upto = settled
    state = (scan.last_end, scan.first_start)
    since = _since(budget, _advance(budget, output, state, scan.upto, num))
    if since is None:
        return None
    drawn = _drawn_prefix(output[max(since, num - len(budget.end) + 1) : num].tolist(), budget.end)
    if num - since - drawn < budget.budget:
        return None
    return budget.end[drawn]


def thinking_since(
    tokens: np.ndarray, start: tuple[int, ...], end: tuple[int, ...], *, opened: bool
) -> int | None:
    """Where the thinking still open after `tokens` began (just after its opening tag; 0 when
    it was `opened` before them and nothing closed it), None when none is open. The first
    opening tag after the last closing one opens it: another inside it opens nothing more."""
    budget = ThinkingBudget(budget=0, start=start, end=end, opened=opened)
    return _since(budget, _advance(budget, tokens, (0, 0), 0, len(tokens)))


def _since(budget: ThinkingBudget, state: tuple[int, int]) -> int | None:
    last_end, first_start = state
    if not last_end and budget.opened:
        return 0
    return first_start or None


def _advance(
    budget: ThinkingBudget, tokens: np.ndarray, state: tuple[int, int], lo: int, hi: int
) -> tuple[int, int]:
    """(last_end, first_start) after tokens[:hi], from theirs after tokens[:lo]."""
    last_end, first_start = state
    if hi <= lo:
        return state
    base = max(lo - max(len(budget.start), len(budget.end)) + 1, 0)
    window = tokens[base:hi]
    ends = [at for at in tag_ends(window, budget.end) if at + base > lo]
    if ends:
        last_end, first_start = ends[-1] + base, 0
    if not first_start:
        past = max(lo, last_end) - base
        first_start = next((at + base for at in tag_ends(window, budget.start) if at > past), 0)
    return last_end, first_start


def tag_ends(output: np.ndarray, tag: tuple[int, ...]) -> list[int]:
    """Positions just after each occurrence of `tag` in `output`, ascending."""
    size = len(output) - len(tag) + 1
    if size <= 0:
        return []
    if len(output) <= _SMALL:
        tokens, width = output.tolist(), len(tag)
        return [i + width for i in range(size) if tuple(tokens[i : i + width]) == tag]
    hit = np.ones(size, bool)
    for i, token in enumerate(tag):
        hit &= output[i : i + size] == token
    return (np.flatnonzero(hit) + len(tag)).tolist()


def _drawn_prefix(tail: list[int], end: tuple[int, ...]) -> int:
    """The longest proper prefix of the closing tag that `tail` (the thought's last tokens)
    ends with."""
    for size in range(min(len(end) - 1, len(tail)), 0, -1):
        if tuple(tail[len(tail) - size :]) == end[:size]:
            return size
    return 0
