"""Parallel sampling through the whole graph (fake runner): events tagged with their sample's
index, one end per sample, the request's stream closing at the last; aborts; best_of."""

from __future__ import annotations

import anyio
import msgspec
import pytest
from graph_helpers import by_index, collect, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.actors.core.sample_streams import SampleFamily
from troupe.gpu.fake_runner import EOS_SEED_BASE, FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner
from troupe.messages import (
    Aborted,
    Delta,
    Finished,
    Pooling,
    Rejected,
    StreamEvent,
    Timings,
    TokenLogprob,
    Usage,
)
from troupe.messages.samples import sample_params

pytestmark = pytest.mark.anyio

CONFIG = EngineConfig(runner="fake", num_kv_blocks=512, num_cpu_blocks=64, max_num_samples=8)
PROMPT = [100 + (i * 37) % 5000 for i in range(70)]


async def test_n_samples_stream_under_their_index_and_equal_lone_runs() -> None:
    params = SamplingParams(n=3, max_tokens=9, seed=77)
    async with Engine.open(CONFIG) as engine:
        events = await collect(engine, PROMPT, params, request_id="p")
        samples = by_index(events)
        assert sorted(samples) == [0, 1, 2]
        for i, sample in samples.items():
            tokens = [t for e in sample for t in e.token_ids]
            assert tokens == FakeRunner.reference_tokens(PROMPT, 9, sample_params(params, i))
            alone = await collect(engine, PROMPT, SamplingParams(max_tokens=9, seed=77 + i))
            assert tokens == [t for e in alone for t in e.token_ids]
            end = sample[-1]
            assert isinstance(end, Finished) and end.request_id == "p"
            assert end.usage.completion_tokens == 9 and end.usage.prompt_tokens == len(PROMPT)
        await wait_blocks_free(engine)


@pytest.mark.parametrize("steps", [0, 2])  # held at the prefill; held after the fork
async def test_abort_of_the_request_ends_each_sample_once(steps: int) -> None:
    runner = FaultyRunner(FakeRunner.from_config(CONFIG))
    events: list[StreamEvent] = []
    async with Engine.open(CONFIG, runner=runner) as engine:
        runner.hold_after(steps)

        async def run() -> None:
            params = SamplingParams(n=4, max_tokens=200, seed=1)
            async for event in engine.generate(PROMPT, params, request_id="p"):
                events.append(event)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await anyio.to_thread.run_sync(runner.wait_until_held)
            await engine.abort("p")  # the step stays held: the abort alone ends the stream
            with anyio.fail_after(10):
                while not (events and events[-1].is_terminal):
                    await anyio.sleep(0.01)
            runner.release()
        samples = by_index(events)
        assert sorted(samples) == [0, 1, 2, 3]
        assert all(isinstance(s[-1], Aborted) for s in samples.values())
        assert all(len(s) == 1 + (steps == 2) for s in samples.values())  # a token after the fork
        await wait_blocks_free(engine)


async def test_best_of_returns_the_n_best_by_cumulative_logprob() -> None:
    # Seeds EOS_SEED_BASE + 3 + i: sample i stops at its (3 + i)-th token, so shorter samples
    # have the higher sums of logprobs (each -1.0 in the fake model).
    params = SamplingParams(n=2, best_of=4, max_tokens=20, seed=EOS_SEED_BASE + 3)
    async with Engine.open(CONFIG) as engine:
        events = await collect(engine, PROMPT, params)
        assert all(isinstance(e, Finished) for e in events)  # nothing streams with best_of
        samples = by_index(events)
        assert sorted(samples) == [0, 1]
        ends = [samples[i][0] for i in (0, 1)]
        assert [e.cumulative_logprob for e in ends] == [-3.0, -4.0]  # type: ignore[union-attr]
        assert [len(e.token_ids) for e in ends] == [3, 4]
        assert all(e.logprobs is None for e in ends)  # type: ignore[union-attr]
        assert all(e.prompt_logprobs is None for e in ends)  # type: ignore[union-attr]
        # prompt logprobs reach each of the n best (their first events'); an embedding is one
        # per prompt: not with samples
        more = msgspec.structs.replace(params, prompt_logprobs=1)
        ranked = [e for e in await collect(engine, PROMPT, more) if isinstance(e, Finished)]
        assert len(ranked) == 2
        for end in ranked:
            assert end.prompt_logprobs is not None
            assert [lp.token_id for lp in end.prompt_logprobs] == PROMPT[1:]
        pooled = msgspec.structs.replace(params, pooling=Pooling())
        [refused] = await collect(engine, PROMPT, pooled)
        assert isinstance(refused, Rejected) and refused.field == "pooling"
        await wait_blocks_free(engine)


def test_best_of_ranking_is_by_cumulative_logprob_not_by_index() -> None:
    family = SampleFamily(["a", "b", "c"], 2, ranks=True, keeps_logprobs=True)
    out: list[StreamEvent] = []
    for index, (sample, lp) in enumerate((("a", -5.0), ("b", -1.0), ("c", -2.0))):
        token = TokenLogprob(7, lp)
        out += family.on_event(
            sample,
            index,
            Delta(request_id="r", text="x", token_ids=(7,), logprobs=(token,), index=index),
        )
        end = Finished(
            request_id="r",
            text="y",
            token_ids=(),
            finish_reason="stop",
            usage=Usage(prompt_tokens=1, completion_tokens=1),
            timings=Timings(ttft=None, tpot=None, e2e=0.0),
            index=index,
        )
        out += family.on_event(sample, index, end)
    assert [(e.index, e.cumulative_logprob, e.samples_left) for e in out] == [  # type: ignore[union-attr]
        (0, -1.0, 1),
        (1, -2.0, 0),
    ]
    assert [e.text for e in out] == ["xy", "xy"]


async def test_bad_n_and_best_of_are_rejected_naming_the_field() -> None:
    cases = [
        ({"n": 9}, "n"),  # over max_num_samples (8)
        ({"n": 2, "best_of": 9}, "best_of"),
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"n": 0}, "n"),
    ]
    async with Engine.open(CONFIG) as engine:
        for params, field in cases:
            (event,) = await collect(engine, PROMPT, {"max_tokens": 4, **params})
            assert isinstance(event, Rejected) and event.field == field, event
        rid = "a\x1fb"
        (event,) = await collect(engine, PROMPT, {"max_tokens": 4}, request_id=rid)
        assert isinstance(event, Rejected) and event.field == "request_id", event


async def test_greedy_samples_are_allowed_and_identical() -> None:
    async with Engine.open(CONFIG) as engine:
        events = await collect(engine, "Hello", {"n": 2, "max_tokens": 5, "temperature": 0})
        samples = by_index(events)
        texts = ["".join(e.text for e in s) for s in samples.values()]
        assert len(texts) == 2 and texts[0] == texts[1]
