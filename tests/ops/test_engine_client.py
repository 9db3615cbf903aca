"""The benchmarks' two ways of driving an engine (ops/engine_client.py) give the same outputs:
a task per request through Engine.generate, or callbacks through Engine.submit, rejected
requests included (their terminal event comes at once and must not leave the run waiting)."""

from __future__ import annotations

import pytest
from troupe import Engine, EngineConfig, SamplingParams
from troupe.ops.engine_client import CLIENTS, Client, run_requests


@pytest.mark.anyio
@pytest.mark.parametrize("client", CLIENTS)
async def test_both_clients_count_every_requests_tokens(client: Client) -> None:
    config = EngineConfig(runner="fake", device="cpu", max_model_len=64, num_kv_blocks=64)
    prompts = [[5, 6, 7], [8, 9], list(range(10, 200)), [11]]  # the third is too long
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (3, 5, 4, 1)]
    async with Engine.open(config) as engine:
        counts = await run_requests(engine, prompts, params, client)
        assert counts == [3, 5, 0, 1]
        assert await run_requests(engine, [], [], client) == []
