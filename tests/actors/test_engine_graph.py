"""Whole-graph tests: every actor, real tokenizer and streamer, the fake runner."""

from __future__ import annotations

import random

import anyio
import pytest
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import Aborted, Delta, Finished, Rejected

pytestmark = pytest.mark.anyio


def fake_config(**kw: object) -> EngineConfig:
    base: dict[str, object] = {"runner": "fake", "num_kv_blocks": 4096, "num_cpu_blocks": 256}
    base.update(kw)
    return EngineConfig(**base)  # type: ignore[arg-type]


async def test_a_burst_enters_without_parking_senders_in_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """300 requests at once fit the client edge's buffer (actors/wiring.py): none of their
    senders waits for room in a worker thread (ThreadInbox.put), a thread hop each that held a
    300-request burst's first tokens back by ~100 ms (docs/benchmarks.md, session 16)."""
    from troupe.actors.thread_inbox import ThreadInbox

    parked: list[object] = []
    put = ThreadInbox.put

    def counting_put(self: ThreadInbox, item: object) -> None:
        parked.append(item)
        put(self, item)

    monkeypatch.setattr(ThreadInbox, "put", counting_put)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    async with Engine.open(fake_config()) as engine:
        async with anyio.create_task_group() as tg:
            for i in range(300):
                tg.start_soon(collect, engine, [100 + i, 7, 9], params)
    assert parked == []


async def test_thousand_concurrent_requests_finish_with_expected_tokens() -> None:
    rng = random.Random(1234)
    jobs = []
    for i in range(1000):
        prompt = [rng.randrange(100, 30000) for _ in range(rng.randint(1, 120))]
        params = SamplingParams(max_tokens=rng.randint(1, 24), temperature=0.0)
        jobs.append((f"r{i}", prompt, params))
    results: dict[str, list] = {}
    async with Engine.open(fake_config(max_num_seqs=128, max_num_batched_tokens=2048)) as engine:

        async def one(request_id: str, prompt: list[int], params: SamplingParams) -> None:
            results[request_id] = await collect(engine, prompt, params, request_id=request_id)

        async with anyio.create_task_group() as tg:
            for job in jobs:
                tg.start_soon(one, *job)
        await wait_blocks_free(engine)
        stats = engine.stats()
    assert len(results) == 1000
    for request_id, prompt, params in jobs:
        events = results[request_id]
        end = terminal(events)
        assert isinstance(end, Finished), end
        expected = FakeRunner.reference_tokens(prompt, params.max_tokens, params)
        assert token_ids(events) == expected, request_id
        assert end.usage.completion_tokens == len(expected)
        assert end.usage.prompt_tokens == len(prompt)
    assert stats.num_gpu_blocks_used == 0


async def test_text_prompt_and_chat_stream_text() -> None:
    async with Engine.open(fake_config()) as engine:
        events = await collect(engine, "Hello there", {"max_tokens": 8, "temperature": 0})
        end = terminal(events)
        assert isinstance(end, Finished)
        assert end.finish_reason == "length"
        text = "".join(e.text for e in events)
        assert text == engine.tokenizer.decode(token_ids(events), skip_special_tokens=True)
        chat = await collect(engine, [{"role": "user", "content": "hi"}], {"max_tokens": 4})
        assert isinstance(terminal(chat), Finished)
        assert terminal(chat).usage.prompt_tokens > 4  # the template added its tokens


@pytest.mark.parametrize(
    ("prompt", "params", "field"),
    [
        ("", {"max_tokens": 4}, "prompt"),
        ([], {"max_tokens": 4}, "prompt_token_ids"),
        ("hi", {"max_tokens": 0}, "max_tokens"),
        ("hi", {"temperature": -0.5}, "temperature"),
        ("hi", {"temperature": float("nan")}, "temperature"),
        ("hi", {"top_p": 0.0}, "top_p"),
        ("hi", {"top_p": 1.5}, "top_p"),
        ("hi", {"max_tokens": 4, "bogus_field": 1}, "bogus_field"),
        ("hi", {"max_tokens": "many"}, "max_tokens"),
        ([1, 2, 10**9], {"max_tokens": 4}, "prompt_token_ids"),
        ([1, -5], {"max_tokens": 4}, "prompt_token_ids"),
        ([7] * 5000, {"max_tokens": 4}, "prompt"),
    ],
)
async def test_bad_input_is_rejected_by_name_and_harms_nobody(
    prompt: object, params: dict, field: str
) -> None:
    async with Engine.open(fake_config(max_model_len=2048)) as engine:
        good_prompt = [101, 202, 303]
        good_params = SamplingParams(max_tokens=6, temperature=0.0)
        async with anyio.create_task_group() as tg:
            good: list = []

            async def run_good() -> None:
                good.extend(await collect(engine, good_prompt, good_params))

            tg.start_soon(run_good)
            bad = await collect(engine, prompt, params)
        end = terminal(bad)
        assert isinstance(end, Rejected), end
        assert end.field == field, end
        assert field in end.message or field == "prompt_token_ids" or "prompt" in end.message
        assert isinstance(terminal(good), Finished)
        assert token_ids(good) == FakeRunner.reference_tokens(good_prompt, 6, good_params)
        await wait_blocks_free(engine)


async def test_break_aborts_and_frees_blocks() -> None:
    async with Engine.open(fake_config()) as engine:
        seen = 0
        async for event in engine.generate([5] * 300, SamplingParams(max_tokens=1000)):
            assert isinstance(event, Delta)
            seen += 1
            if seen == 3:
                break
        await wait_blocks_free(engine)
        assert engine.num_active == 0


@pytest.mark.parametrize("stage", ["queued", "prefilling", "decoding"])
async def test_abort_at_every_stage_frees_every_block(stage: str) -> None:
    # A tiny token budget so the 3,000-token prompt takes ~190 prefill steps; one sequence at a
    # time so a second request queues behind the first.
    config = fake_config(max_num_seqs=1, max_num_batched_tokens=16, num_kv_blocks=512)
    async with Engine.open(config) as engine:
        events: list = []
        scope = anyio.CancelScope()

        async def victim() -> None:
            with scope:
                async for event in engine.generate(
                    [11] * 3000, SamplingParams(max_tokens=500), request_id="victim"
                ):
                    events.append(event)

        async def until(condition) -> None:  # type: ignore[no-untyped-def]
            with anyio.fail_after(10):
                while not condition():
                    await anyio.sleep(0.0005)

        async with anyio.create_task_group() as tg:
            if stage == "queued":
                tg.start_soon(collect, engine, [9] * 64, SamplingParams(max_tokens=400))
                await until(lambda: engine.stats().num_running == 1)
            tg.start_soon(victim)
            if stage == "queued":
                await until(lambda: engine.stats().num_waiting == 1)
            elif stage == "prefilling":
                await until(lambda: engine.stats().num_gpu_blocks_used >= 4)
            else:
                await until(lambda: len(events) >= 2)
            used_before = engine.stats().num_gpu_blocks_used
            scope.cancel()
        if stage == "prefilling":
            assert events == []  # still chewing through the prompt
            assert used_before >= 4
        if stage == "decoding":
            assert len(events) >= 2
        await wait_blocks_free(engine)
        assert engine.num_active == 0
        # The engine still serves after the abort.
        after = await collect(engine, [3, 4, 5], SamplingParams(max_tokens=3))
        assert isinstance(terminal(after), Finished)


async def test_abort_all_gives_each_request_one_terminal() -> None:
    async with Engine.open(fake_config(max_num_seqs=4)) as engine:
        results: list[list] = []

        async def one(i: int) -> None:
            results.append(await collect(engine, [i + 100] * 20, SamplingParams(max_tokens=10_000)))

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
            await anyio.sleep(0.2)
            await engine.abort_all("test")
        assert len(results) == 12
        for events in results:
            assert isinstance(terminal(events), Aborted)
        await wait_blocks_free(engine)


async def test_slow_reader_is_cut_off_with_one_failed_event_and_blocks_freed() -> None:
    async with Engine.open(fake_config(max_stream_buffer=4)) as engine:
        dispatched = 0
        overflowed = anyio.Event()

        def count(event: object, now: float) -> None:
            nonlocal dispatched
            dispatched += 1
            if dispatched > 1 + 4 + 1:  # one read, four buffered: the buffer has overflowed
                overflowed.set()

        engine.add_event_listener(count)
        events = []
        gen = engine.generate([7] * 10, SamplingParams(max_tokens=2000, ignore_eos=True))
        events.append(await gen.__anext__())
        first_batch = dispatched  # at most what the reader took (the rest of its batch held)
        with anyio.fail_after(120):  # stop reading while the engine runs on (a hang guard)
            await overflowed.wait()
        async for event in gen:
            events.append(event)
        end = terminal(events)
        assert end.finish_reason == "error" and "too slow" in end.message
        assert len(events) <= first_batch + 4 + 1  # then four buffered, then the cut-off
        await wait_blocks_free(engine)


async def test_submit_delivers_to_callback_and_abort_ends_it() -> None:
    async with Engine.open(fake_config()) as engine:
        got: list = []
        done = anyio.Event()

        def on_event(event: object) -> None:
            got.append(event)
            if event.is_terminal:  # type: ignore[attr-defined]
                done.set()

        rid = await engine.submit([5, 6], SamplingParams(max_tokens=100_000), on_event)
        with anyio.fail_after(120):  # a hang guard only
            while not got:
                await anyio.sleep(0.001)
        await engine.abort(rid)
        with anyio.fail_after(120):  # a hang guard only
            await done.wait()
        assert isinstance(got[-1], Aborted)
        assert sum(1 for e in got if e.is_terminal) == 1
        await wait_blocks_free(engine)
        assert engine.num_active == 0
