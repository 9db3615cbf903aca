"""The engine embedded in a caller's task group, next to the caller's own tasks."""

from __future__ import annotations

import asyncio

import anyio
import pytest
import trio
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import Finished

CONFIG = EngineConfig(runner="fake", num_kv_blocks=256, num_cpu_blocks=16)
PARAMS = SamplingParams(max_tokens=7, temperature=0.0)


async def use_engine(engine: Engine) -> list[int]:
    events = await collect(engine, [42, 43, 44], PARAMS)
    assert isinstance(terminal(events), Finished)
    await wait_blocks_free(engine)
    return token_ids(events)


@pytest.mark.trio
async def test_engine_inside_a_trio_nursery() -> None:
    ticks = 0

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.001)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(heartbeat)
        engine = await Engine.start(CONFIG, nursery)  # a trio nursery is an anyio task group here
        tokens = await use_engine(engine)
        await engine.aclose()
        nursery.cancel_scope.cancel()
    assert tokens == FakeRunner.reference_tokens([42, 43, 44], 7, PARAMS)
    assert ticks > 0


def test_engine_inside_an_asyncio_app() -> None:
    async def app() -> tuple[list[int], int]:
        ticks = 0

        async def heartbeat() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        async with anyio.create_task_group() as tg:
            beat = asyncio.get_running_loop().create_task(heartbeat())
            engine = await Engine.start(CONFIG, tg)
            tokens = await use_engine(engine)
            await engine.aclose()
            beat.cancel()
        return tokens, ticks

    tokens, ticks = asyncio.run(app())
    assert tokens == FakeRunner.reference_tokens([42, 43, 44], 7, PARAMS)
    assert ticks > 0


def test_open_under_trio_run_and_asyncio_run() -> None:
    async def main() -> list[int]:
        async with Engine.open(CONFIG) as engine:
            return await use_engine(engine)

    expected = FakeRunner.reference_tokens([42, 43, 44], 7, PARAMS)
    assert trio.run(main) == expected
    assert asyncio.run(main()) == expected
