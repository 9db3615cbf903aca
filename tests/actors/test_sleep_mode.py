"""Sleep mode through the whole graph with the fake runner (gpu/fake_sleep.py drops its KV
contents on sleep, so a block read from before a sleep fails its request): a sleep frees every
block and forgets the prefix cache, requests sent while asleep wait for the wake-up, a sleep
with requests live is refused naming them (or waits for them, or aborts them), refusals name
the flag, the level, the tag."""

from __future__ import annotations

import anyio
import pytest
from graph_helpers import collect, terminal, token_ids
from troupe import Engine, EngineConfig, SamplingParams
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.fake_sleep import SleepyFakeRunner
from troupe.gpu.faulty_runner import FaultyRunner
from troupe.messages import Aborted, Finished
from troupe.messages.sleep_calls import SleepErrorCode, SleepTag

pytestmark = pytest.mark.anyio

CONFIG = EngineConfig(
    runner="fake", num_kv_blocks=64, block_size=4, num_cpu_blocks=8, enable_sleep_mode=True
)
PROMPT = list(range(100, 121))  # 5 full blocks: cached once it ends
PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


async def _until(check: object, engine: Engine) -> None:
    """Until `check(engine.stats())` holds (each snapshot the scheduler publishes)."""
    with anyio.fail_after(10):
        while not check(engine.stats()):  # type: ignore[operator]
            await anyio.sleep(0.005)


async def test_sleep_frees_every_block_and_forgets_the_prefix_cache() -> None:
    async with Engine.open(CONFIG) as engine:
        before = await collect(engine, PROMPT, PARAMS)
        await _until(lambda s: s.num_gpu_blocks_cached > 0 and s.num_gpu_blocks_used == 0, engine)
        assert not await engine.is_sleeping()
        reply = await engine.sleep(1)
        assert reply.success and reply.is_sleeping, reply
        assert reply.sleeping == (SleepTag.WEIGHTS, SleepTag.KV_CACHE) and reply.level == 1
        assert reply.dropped is not None and reply.dropped.num_gpu_blocks >= 5
        # the stats come the streamer's way, after the reply: every block free, none cached
        await _until(lambda s: s.num_gpu_blocks_cached == 0 and s.num_gpu_blocks_used == 0, engine)
        assert await engine.is_sleeping()
        woke = await engine.wake_up()
        assert woke.success and not woke.is_sleeping and not await engine.is_sleeping()
        hits = engine.stats().prefix_cache_hit_tokens
        after = await collect(engine, PROMPT, PARAMS)  # a cache hit would read dropped KV
        assert isinstance(terminal(after), Finished), after
        assert token_ids(after) == token_ids(before)
        assert engine.stats().prefix_cache_hit_tokens == hits  # computed again, not hit


async def test_requests_sent_while_asleep_wait_for_the_wake_up() -> None:
    async with Engine.open(CONFIG) as engine:
        expected = token_ids(await collect(engine, PROMPT, PARAMS))
        await engine.sleep(2)
        events: list[object] = []

        async def run() -> None:
            events.extend(await collect(engine, PROMPT, PARAMS))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await _until(lambda s: s.num_waiting == 1, engine)  # held by the scheduler
            assert events == []
            partial = await engine.wake_up(["weights"])
            assert partial.success and partial.sleeping == (SleepTag.KV_CACHE,)
            assert await engine.is_sleeping() and events == []  # still waiting
            assert (await engine.wake_up(["kv_cache"])).success
        assert isinstance(terminal(events), Finished)  # type: ignore[arg-type]
        assert token_ids(events) == expected  # type: ignore[arg-type]


class _HeldSleepy(FaultyRunner):
    """The sleepy fake runner, whose steps a test can hold."""

    def __init__(self, inner: SleepyFakeRunner) -> None:
        super().__init__(inner)
        self.sleeper = inner.sleeper


def _held_runner() -> _HeldSleepy:
    return _HeldSleepy(SleepyFakeRunner(FakeRunner.from_config(CONFIG)))


async def test_a_sleep_with_requests_live_is_refused_naming_them() -> None:
    runner = _held_runner()
    runner.hold_after(1)
    async with Engine.open(CONFIG, runner=runner) as engine:
        async with anyio.create_task_group() as tg:
            events: list[object] = []

            async def run() -> None:
                events.extend(await collect(engine, PROMPT, PARAMS, request_id="busy-1"))

            tg.start_soon(run)
            await anyio.to_thread.run_sync(runner.wait_until_held)
            reply = await engine.sleep(1)
            assert reply.error == SleepErrorCode.RUNNING and not reply.is_sleeping
            assert "'busy-1'" in reply.message and "abort" in reply.message
            assert not await engine.is_sleeping()
            runner.release()
        assert isinstance(terminal(events), Finished)  # type: ignore[arg-type]
        assert (await engine.sleep(1)).success  # none live now


async def test_sleep_mode_wait_lets_them_end_and_abort_ends_them() -> None:
    runner = _held_runner()
    async with Engine.open(CONFIG, runner=runner) as engine:
        for mode, ending in (("wait", Finished), ("abort", Aborted)):
            runner.hold_after(1)
            events: list[object] = []
            async with anyio.create_task_group() as tg:

                async def run(events: list[object] = events) -> None:
                    events.extend(await collect(engine, PROMPT, PARAMS))

                tg.start_soon(run)
                await anyio.to_thread.run_sync(runner.wait_until_held)
                slept: list[object] = []

                async def sleep(mode: str = mode, slept: list[object] = slept) -> None:
                    slept.append(await engine.sleep(1, mode=mode))  # type: ignore[arg-type]

                tg.start_soon(sleep)
                if mode == "wait":
                    await _until(lambda s: s.num_running == 1, engine)
                    assert slept == []  # waits for the request held in its step
                else:  # aborted while its step is held: it ends before the step does
                    with anyio.fail_after(10):
                        while not events:
                            await anyio.sleep(0.005)
                runner.release()
            assert isinstance(terminal(events), ending), (mode, events)  # type: ignore[arg-type]
            assert slept[0].success and slept[0].is_sleeping  # type: ignore[attr-defined]
            assert (await engine.wake_up()).success


async def test_refusals_name_the_flag_the_level_and_the_tag() -> None:
    async with Engine.open(EngineConfig(runner="fake", num_kv_blocks=16)) as engine:
        off = await engine.sleep(1)
        assert off.error == SleepErrorCode.DISABLED and "enable_sleep_mode" in off.message
        assert (await engine.wake_up()).error == SleepErrorCode.DISABLED
    async with Engine.open(CONFIG) as engine:
        level = await engine.sleep(3)
        assert level.error == SleepErrorCode.INVALID and "level" in level.message
        tag = await engine.wake_up(["weights", "optimizer"])
        assert tag.error == SleepErrorCode.INVALID and "'optimizer'" in tag.message
        assert not await engine.is_sleeping()
        awake = await engine.wake_up()  # nothing sleeps: nothing to do (vLLM warns)
        assert awake.success and "nothing" in awake.message
        assert (await engine.sleep(1)).success
        again = await engine.sleep(2)  # already asleep: vLLM's no-op
        assert again.success and again.level == 1 and "already" in again.message
