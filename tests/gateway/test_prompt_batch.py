"""gateway/prompt_batch.py against a scripted engine: every prompt submitted at once, events
re-indexed prompt-major with one terminal event, a refusal held back until every prompt has
answered, errors raised, and every prompt's stream closed however the merge ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from troupe.gateway.prompt_batch import batch_events, batch_usage
from troupe.messages import (
    Delta,
    Finished,
    FinishReason,
    RejectCode,
    Rejected,
    SamplingParams,
    StreamEvent,
    Timings,
    Usage,
)

TIMINGS = Timings(ttft=None, tpot=None, e2e=0.0)


def _finished(rid: str, index: int, left: int, prompt_tokens: int = 3) -> Finished:
    return Finished(
        request_id=rid,
        text="",
        token_ids=(),
        finish_reason=FinishReason.LENGTH,
        usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=2, cached_tokens=0),
        timings=TIMINGS,
        index=index,
        samples_left=left,
    )


class ScriptedEngine:
    """generate(prompt) plays the script named by the prompt; `gates` hold a script until set."""

    def __init__(self, scripts: dict[str, list[StreamEvent | Exception]]) -> None:
        self.scripts = scripts
        self.started: list[str] = []
        self.closed: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}

    async def generate(
        self, prompt: str, params: SamplingParams, *, request_id: str
    ) -> AsyncIterator[StreamEvent]:
        self.started.append(request_id)
        try:
            for item in self.scripts[prompt]:
                if prompt in self.gates:
                    await self.gates[prompt].wait()
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.closed.append(request_id)


async def _all(events: AsyncIterator[StreamEvent]) -> list[StreamEvent]:
    return [event async for event in events]


@pytest.mark.anyio
async def test_reindexed_prompt_major_with_one_terminal_event() -> None:
    engine = ScriptedEngine(
        {
            "a": [
                Delta(request_id="x", text="1", token_ids=(1,), index=1),
                _finished("x", 1, 1),
                _finished("x", 0, 0),
            ],
            "b": [
                Delta(request_id="y", text="2", token_ids=(2,)),
                _finished("y", 1, 1),
                _finished("y", 0, 0, prompt_tokens=5),
            ],
        }
    )
    events = await _all(batch_events(engine, ["a", "b"], SamplingParams(n=2), "r"))
    assert engine.started == ["r-0", "r-1"] and sorted(engine.closed) == ["r-0", "r-1"]
    assert sorted(e.index for e in events if isinstance(e, Finished)) == [0, 1, 2, 3]
    assert [e.index for e in events if isinstance(e, Delta)] in ([1, 2], [2, 1])
    terminal = [e for e in events if e.is_terminal]
    assert terminal == [events[-1]]
    ended = [(e.index, e.usage) for e in events if isinstance(e, Finished)]
    assert batch_usage(ended, 2) == Usage(prompt_tokens=8, completion_tokens=8, cached_tokens=0)


@pytest.mark.anyio
async def test_a_refusal_is_the_only_event_and_names_its_prompt() -> None:
    refused = Rejected(request_id="y", code=RejectCode.TOO_LONG, message="too long", field="prompt")
    engine = ScriptedEngine(
        {
            "a": [Delta(request_id="x", text="1", token_ids=(1,)), _finished("x", 0, 0)],
            "b": [refused],
        }
    )
    events = await _all(batch_events(engine, ["a", "b"], SamplingParams(), "r"))
    assert len(events) == 1 and isinstance(events[0], Rejected)
    assert events[0].field == "prompt[1]" and events[0].message == "prompt[1]: too long"
    assert sorted(engine.closed) == ["r-0", "r-1"]  # the other prompt's request is closed


@pytest.mark.anyio
async def test_an_engine_error_is_raised_and_every_stream_closed() -> None:
    engine = ScriptedEngine(
        {
            "a": [Delta(request_id="x", text="1", token_ids=(1,)), RuntimeError("engine died")],
            "b": [Delta(request_id="y", text="2", token_ids=(2,)), _finished("y", 0, 0)],
        }
    )
    with pytest.raises(RuntimeError, match="engine died"):
        await _all(batch_events(engine, ["a", "b"], SamplingParams(), "r"))
    assert sorted(engine.closed) == ["r-0", "r-1"]


@pytest.mark.anyio
async def test_leaving_early_closes_every_stream() -> None:
    engine = ScriptedEngine(
        {
            "a": [Delta(request_id="x", text="1", token_ids=(1,)), _finished("x", 0, 0)],
            "b": [Delta(request_id="y", text="2", token_ids=(2,)), _finished("y", 0, 0)],
        }
    )
    engine.gates["b"] = gate = asyncio.Event()
    events = batch_events(engine, ["a", "b"], SamplingParams(), "r")
    first = asyncio.ensure_future(anext(events))
    for _ in range(20):  # every ready task runs: "a" has answered, "b" waits at its gate
        await asyncio.sleep(0)
    assert engine.started == ["r-0", "r-1"] and not first.done()  # held until "b" answers
    gate.set()
    assert isinstance(await first, Delta)
    await events.aclose()  # the client went away after one event
    assert sorted(engine.closed) == ["r-0", "r-1"]
