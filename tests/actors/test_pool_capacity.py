"""A request that could never fit the KV pool is refused before it runs, not failed mid-stream."""

from __future__ import annotations

import pytest
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.messages import Finished, RejectCode, Rejected

pytestmark = pytest.mark.anyio

CONFIG = EngineConfig(runner="fake", num_kv_blocks=4, block_size=16, num_cpu_blocks=4)


async def test_max_model_len_is_capped_at_the_pool() -> None:
    async with Engine.open(CONFIG) as engine:
        assert engine.max_model_len <= 4 * 16
        too_long = await collect(engine, list(range(100, 170)), SamplingParams(max_tokens=4))
        event = terminal(too_long)
        assert isinstance(event, Rejected) and event.code == RejectCode.TOO_LONG
        assert event.field == "prompt"
        params = SamplingParams(max_tokens=1000, ignore_eos=True)
        events = await collect(engine, list(range(100, 110)), params)
        end = terminal(events)
        assert isinstance(end, Finished) and end.finish_reason == "length"
        assert len(token_ids(events)) == engine.max_model_len - 10
        await wait_blocks_free(engine)
