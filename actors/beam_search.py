"""Beam search over an engine, as vLLM's `LLM.beam_search` does it: round after round, each
live beam runs as a one-token request asking for its 2 x beam_width most likely next tokens
(`logprobs`), every candidate extends its beam's cumulative logprob, and the beam_width best
candidates that did not end live on. A candidate ending in EOS (unless ignore_eos) is
completed; so is a beam that reaches max_tokens or max_model_len. The beam_width best of the
completed come back, best first.

Ranking is vLLM's: cumulative logprob / length ** length_penalty, the length counting the
prompt and the output (less a final EOS). Each round's requests are the prompt plus the beam's
tokens, so the prefix cache serves all but the last block of them (keep it on): a round costs
the beams' last blocks, not their prompts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import anyio
import msgspec
from anyio.abc import TaskGroup
from troupe.messages import (
    Aborted,
    Delta,
    Failed,
    Finished,
    ParamError,
    RejectCode,
    Rejected,
    SamplingParams,
    StreamEvent,
)


class BeamSearchParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    beam_width: int
    max_tokens: int = 16
    ignore_eos: bool = False
    length_penalty: float = 1.0
    # each round's requests run with this LoRA adapter and prefix-cache salt (SamplingParams')
    lora: str | None = None
    cache_salt: str | None = None

    def check(self, max_logprobs: int = 20) -> None:
        if not 1 <= self.beam_width <= max_logprobs // 2:
            raise ParamError(
                "beam_width",
                f"beam_width must be in [1, {max_logprobs // 2}] (each beam asks for "
                f"2 x beam_width logprobs, at most {max_logprobs}), got {self.beam_width}",
            )
        if self.max_tokens < 1:
            raise ParamError("max_tokens", f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (math.isfinite(self.length_penalty) and abs(self.length_penalty) <= 10.0):
            # length ** penalty must stay a finite float for every length a model can reach
            raise ParamError(
                "length_penalty",
                f"length_penalty must be in [-10, 10], got {self.length_penalty!r}",
            )


@dataclasses.dataclass(frozen=True)
class Beam:
    """One finished beam: its output tokens and text, and what ranked it."""

    token_ids: tuple[int, ...]
    text: str
    cumulative_logprob: float
    score: float
    finish_reason: str  # "stop" (EOS) or "length"


class BeamEngine(Protocol):
    """What beam search needs of an engine: the Engine, or a gateway's engine in a child."""

    @property  # read-only: RemoteEngine's tokenizer is a property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    @property
    def tokenizer(self) -> Any: ...  # decode(token_ids, skip_special_tokens=...)

    def generate(
        self, prompt: Any, params: Any, *, request_id: str | None = None
    ) -> AsyncIterator[StreamEvent]: ...


class BeamSearchError(Exception):
    """A round's request was refused or ended abnormally: the field, the engine's message and
    its terminal event (a server maps it to its status)."""

    def __init__(
        self, field: str | None, message: str, event: Rejected | Aborted | Failed | None = None
    ) -> None:
        super().__init__(message)
        self.field = field
        self.event = event


@dataclasses.dataclass(frozen=True)
class _Candidate:
    tokens: tuple[int, ...]
    logprob: float
    ended: bool  # by EOS


def score(num_prompt: int, candidate: _Candidate, length_penalty: float) -> float:
    length = num_prompt + len(candidate.tokens) - candidate.ended
    return candidate.logprob / float(max(length, 1) ** length_penalty)


async def beam_search(
    engine: BeamEngine, prompt_ids: Sequence[int], params: BeamSearchParams
) -> list[Beam]:
    """The params.beam_width best beams after `prompt_ids`, best first (see the module).
    Raises ParamError for bad params, BeamSearchError when the engine refuses a round."""
    params.check()
    prompt = tuple(prompt_ids)
    eos = set(engine.eos_token_ids)
    live = [_Candidate((), 0.0, False)]
    done: list[tuple[_Candidate, str]] = []
    width = params.beam_width
    for _ in range(params.max_tokens):
        tops = await _next_tokens(engine, prompt, live, 2 * width, params)
        grown: list[_Candidate] = []
        for beam, top in zip(live, tops, strict=True):
            if top is None:  # at max_model_len: it ends here
                done.append((beam, "length"))
                continue
            for token_id, logprob in top:
                ended = token_id in eos and not params.ignore_eos
                new = _Candidate((*beam.tokens, token_id), beam.logprob + logprob, ended)
                if ended:
                    done.append((new, "stop"))
                else:
                    grown.append(new)
        grown.sort(key=lambda c: score(len(prompt), c, params.length_penalty), reverse=True)
        live = grown[:width]
        if not live:
            break
    done += [(beam, "length") for beam in live]
    done.sort(key=lambda d: score(len(prompt), d[0], params.length_penalty), reverse=True)
    decode = engine.tokenizer.decode
    return [
        Beam(
            token_ids=c.tokens,
            text=decode(list(c.tokens), skip_special_tokens=True),
            cumulative_logprob=c.logprob,
            score=score(len(prompt), c, params.length_penalty),
            finish_reason=reason,
        )
        for c, reason in done[:width]
    ]


async def _next_tokens(
    engine: BeamEngine,
    prompt: tuple[int, ...],
    live: list[_Candidate],
    k: int,
    beam: BeamSearchParams,
) -> list[list[tuple[int, float]] | None]:
    """Each live beam's k most likely next tokens, None where the beam is at max_model_len.
    A prompt too long to extend at all is an error, not a beam."""
    tops: list[list[tuple[int, float]] | None] = [None] * len(live)
    params = SamplingParams(
        max_tokens=1,
        temperature=0.0,
        logprobs=k,
        ignore_eos=True,
        lora=beam.lora,
        cache_salt=beam.cache_salt,
    )
    errors: list[BeamSearchError] = []

    async def one(i: int, tg: TaskGroup) -> None:
        async for event in engine.generate(prompt + live[i].tokens, params):
            if isinstance(event, Delta | Finished) and event.logprobs:
                tops[i] = list(event.logprobs[0].top)
            elif isinstance(event, Rejected):
                if event.code != RejectCode.TOO_LONG or not live[i].tokens:
                    errors.append(BeamSearchError(event.field, event.message, event))
                    tg.cancel_scope.cancel()  # the other beams' requests are aborted
            elif isinstance(event, Aborted | Failed):
                errors.append(BeamSearchError(None, f"a beam's request ended: {event}", event))
                tg.cancel_scope.cancel()

    # Errors are collected, not raised in the tasks: a task group would wrap them in an
    # ExceptionGroup, and callers catch BeamSearchError.
    async with anyio.create_task_group() as tg:
        for i in range(len(live)):
            tg.start_soon(one, i, tg)
    if errors:
        raise errors[0]
    return tops
