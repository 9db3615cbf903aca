"""SmolLM2 (the default model, real weights) drafting for itself through the whole engine on
the CPU: greedy tokens identical to decoding without speculation and nearly every proposal
accepted; every block comes back. One short request: preemption and prefix caching with a
draft are the tiny models' part (test_draft_engine.py), at a fraction of this cost."""

from __future__ import annotations

import anyio
import pytest
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.config import default_model_path
from troupe.messages import EngineStats, Finished

from tests.gpu.test_spec_smollm import BASE, prompts


async def _run(config: EngineConfig) -> tuple[list[int], EngineStats]:
    async with Engine.open(config) as engine:
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        events = await collect(engine, prompts()[1], params)
        await wait_blocks_free(engine, timeout=60)
        stats = engine.stats()
    assert isinstance(terminal(events), Finished)
    return token_ids(events), stats


@pytest.mark.slow
def test_smollm_drafting_for_itself_is_token_identical() -> None:
    plain, _ = anyio.run(_run, EngineConfig(**BASE, num_kv_blocks=32))
    config = EngineConfig(
        **BASE,
        num_kv_blocks=32,
        speculative_method="draft_model",
        draft_model=str(default_model_path()),
        num_speculative_tokens=4,
    )
    spec, stats = anyio.run(_run, config)
    assert spec == plain
    assert stats.num_spec_proposed_tokens >= 8
    assert stats.num_spec_accepted_tokens >= 0.9 * stats.num_spec_proposed_tokens
