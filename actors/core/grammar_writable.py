"""Whether a model's vocabulary can write what a grammar demands.

A byte-level vocabulary need not hold every byte: SmolLM2's has no token that starts with
0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1 or 0xf1-0xff, so no sequence of its tokens
writes U+0004 or any character of planes 4 to 15. A grammar that demands such text (a choice
of it, a regex or schema that starts with it) would get a mask that allows nothing; the model
then samples a token the grammar refuses and the request fails mid-stream. These checks turn
that into a refusal at the client edge, naming the field:

    first_step_error   the grammar's first step allows no token (any kind of spec)
    forced_text_error  the text the grammar forces from its start (xgrammar's jump-forward
                       string: a regex's or a schema's leading literal, a const) holds a byte
                       that no token holds at all
    choice_error       a choice's bytes cannot be cut into tokens of the vocabulary

A grammar that dead-ends only after a free part (`[ab]\x04`) is not caught here: the grammar
core finds it when a fill allows no token, before the model samples there, and the request
ends Failed with FailureCause.GRAMMAR_DEAD_END (a 400 naming the field), its message from
`dead_end_error`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import xgrammar

_MAX_JUMPS = 16  # a jump runs to the next branch; the first few cover any leading literal


def first_step_error(compiled: xgrammar.CompiledGrammar, vocab_size: int) -> str | None:
    """Why the grammar's first token cannot be written (None: some token may start it)."""
    import xgrammar

    matcher = xgrammar.GrammarMatcher(compiled)
    bitmask = np.zeros((1, (vocab_size + 31) // 32), dtype=np.int32)
    matcher.fill_next_token_bitmask(bitmask)
    if bitmask.any():
        return None
    return "no token of this model's vocabulary can begin the text it demands"


def forced_text_error(compiled: xgrammar.CompiledGrammar, tokens: TokenBytes) -> str | None:
    """Why the text the grammar forces from its start cannot be written (None: it may be)."""
    import xgrammar

    matcher = xgrammar.GrammarMatcher(compiled)
    forced = b""
    for _ in range(_MAX_JUMPS):
        text = matcher.find_jump_forward_string()
        if not text or not matcher.accept_string(text):
            break
        forced += text.encode("utf-8", "surrogatepass")
    for index, byte in enumerate(forced):
        if byte not in tokens.held:
            return (
                f"the text it demands holds byte 0x{byte:02x} (at byte {index}), which no "
                "token of this model's vocabulary holds"
            )
    return None


class TokenBytes:
    """The vocabulary's tokens as a set of bytes, for cutting a text into tokens."""

    def __init__(self, vocab: Sequence[bytes]) -> None:
        self._tokens = frozenset(t for t in vocab if t)
        self._longest = max((len(t) for t in self._tokens), default=0)
        self.held = frozenset(b for t in self._tokens for b in t)  # bytes some token holds

    def writable_prefix(self, data: bytes) -> int:
        """How many leading bytes of `data` some sequence of tokens writes exactly (the
        longest such prefix; len(data) when all of it)."""
        reached = [False] * (len(data) + 1)
        reached[0] = True
        best = 0
        for start in range(len(data)):
            if not reached[start]:
                continue
            for end in range(start + 1, min(len(data), start + self._longest) + 1):
                if data[start:end] in self._tokens:
                    reached[end] = True
                    best = max(best, end)
        return best


def choice_error(choices: Sequence[str], tokens: TokenBytes) -> str | None:
    """Why a choice cannot be written (None: every one can)."""
    for index, choice in enumerate(choices):
        data = choice.encode("utf-8", "surrogatepass")
        done = tokens.writable_prefix(data)
        if done < len(data):
            return (
                f"choice[{index}] cannot be written with this model's vocabulary: no token "
                f"continues it at byte {done} (0x{data[done]:02x})"
            )
    return None


def dead_end_error(matcher: xgrammar.GrammarMatcher) -> str:
    """What the matcher wants next, when its mask allowed no token: the bytes it would accept
    (one probe of a fork per byte, only ever at a dead end)."""
    wanted = [b for b in range(256) if matcher.fork().accept_string(bytes([b]))]
    if not wanted:
        return "it allows no byte next"
    shown = ", ".join(f"0x{b:02x}" for b in wanted[:8]) + (", ..." if len(wanted) > 8 else "")
    noun = "byte" if len(wanted) == 1 else "bytes"
    return (
        f"next it allows only {noun} {shown}, and no token of this model's vocabulary "
        "writes what it allows"
    )
