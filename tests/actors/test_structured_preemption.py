"""Structured output under preemption and abort (fake runner: its tokens are bent to the masks).

A matcher is never rolled back: recompute replays KV of tokens it has accepted, swap keeps
them. So a run squeezed into a tiny pool must give the same tokens as a roomy one, every
output must be accepted by a fresh matcher, and every block must come back."""

from __future__ import annotations

import anyio
import pytest
import xgrammar
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.actors.core.grammar_compiler import grammar_compiler_for
from troupe.actors.graph import load_tokenizer_for
from troupe.messages import Aborted, Delta, Finished, StructuredOutputs

pytestmark = pytest.mark.anyio
SPECS = [
    StructuredOutputs(regex="[a-z]{150,200}"),
    StructuredOutputs.from_schema(
        {
            "type": "object",
            "properties": {"w": {"type": "string", "minLength": 150, "maxLength": 200}},
            "required": ["w"],
        }
    ),
]
NUM = 12


async def run(config: EngineConfig) -> tuple[list[list[int]], int]:
    async with Engine.open(config) as engine:
        outs: list[list[int]] = [[] for _ in range(NUM)]

        async def one(i: int) -> None:
            params = SamplingParams(max_tokens=40, seed=i, structured_outputs=SPECS[i % 2])
            events = await collect(engine, f"{i} go", params)
            assert isinstance(terminal(events), Finished)
            outs[i] = token_ids(events)

        async with anyio.create_task_group() as tg:
            for i in range(NUM):
                tg.start_soon(one, i)
        await wait_blocks_free(engine)
        stats = engine.stats()
        return outs, stats.num_preemptions_swap + stats.num_preemptions_recompute


@pytest.mark.parametrize("mode", ["recompute", "swap"])
async def test_preempted_runs_match_and_follow_the_grammar(mode: str) -> None:
    base = EngineConfig(runner="fake", device="cpu", block_size=4, num_cpu_blocks=64)
    roomy, _ = await run(base.replace(num_kv_blocks=1024))
    tight, num_preempted = await run(base.replace(num_kv_blocks=40, preemption_mode=mode))
    assert num_preempted > 0
    assert tight == roomy
    tok = load_tokenizer_for(None)
    compiler = grammar_compiler_for(tok, 49152, tok.eos_token_ids, 30.0)
    for i, ids in enumerate(tight):
        matcher = xgrammar.GrammarMatcher(compiler.compile(SPECS[i % 2]))
        assert all(matcher.accept_token(t) for t in ids), (i, ids)


async def test_abort_mid_way_frees_everything() -> None:
    config = EngineConfig(runner="fake", device="cpu", num_kv_blocks=256)
    async with Engine.open(config) as engine:
        ends = []

        async def one(i: int) -> None:
            params = SamplingParams(max_tokens=60, seed=i, structured_outputs=SPECS[0])
            async for event in engine.generate(f"{i} go", params, request_id=f"r{i}"):
                if isinstance(event, Delta) and i % 2 == 0:
                    await engine.abort(f"r{i}")
                if event.is_terminal:
                    ends.append(event)

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(one, i)
        assert sum(isinstance(e, Aborted) for e in ends) == 3 and len(ends) == 6
        await wait_blocks_free(engine)
