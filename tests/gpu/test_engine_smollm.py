"""The real default model through the whole engine on the CPU: greedy tokens identical to HF
transformers (loading the same GGUF), with prefix caching on and off and with preemption forced
by a tiny KV pool, in both preemption modes."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.actors.graph import load_tokenizer_for
from troupe.messages import Finished

NUM_NEW = 32
SYSTEM = "You are a helpful assistant who answers briefly and precisely."
QUESTIONS = ["What is the capital of France?", "Name three primary colors.", "What is 12 times 7?"]
PARAMS = SamplingParams(max_tokens=NUM_NEW, temperature=0.0, ignore_eos=True)


def prompts() -> list[list[int]]:
    """Chat prompts sharing a system prompt (so prefix caching has something to share), plus
    one plain-text prompt."""
    tok = load_tokenizer_for(None)
    chats = [
        tok.encode(
            tok.render_chat(
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                add_generation_prompt=True,
            ),
            add_special_tokens=False,
        )
        for q in QUESTIONS
    ]
    return [*chats, tok.encode("The theatre troupe arrived in town and", add_special_tokens=True)]


@pytest.fixture(scope="module")
def expected(hf_smollm: Any) -> list[list[int]]:
    """transformers' greedy tokens, the prompts in one left-padded batch (as the engine batches
    them; half the time of one at a time on 2 cores, and the same tokens here)."""
    batch = prompts()
    width = max(map(len, batch))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    with torch.no_grad():
        out = hf_smollm.generate(
            ids, attention_mask=mask, max_new_tokens=NUM_NEW, do_sample=False, pad_token_id=0
        )
    return [row[width:].tolist() for row in out]


async def run_engine(config: EngineConfig) -> tuple[list[list[int]], Any]:
    results: dict[int, list[Any]] = {}
    async with Engine.open(config) as engine:

        async def one(i: int, prompt: list[int]) -> None:
            results[i] = await collect(engine, prompt, PARAMS)

        async with anyio.create_task_group() as tg:
            for i, prompt in enumerate(prompts()):
                tg.start_soon(one, i, prompt)
        await wait_blocks_free(engine, timeout=60)
        stats = engine.stats()
    for events in results.values():
        assert isinstance(terminal(events), Finished)
    return [token_ids(results[i]) for i in range(len(results))], stats


# dequantized to fp32 as transformers runs it: token-identical (the default keeps 4-bit weights)
BASE = {
    "device": "cpu",
    "max_model_len": 512,
    "max_num_seqs": 4,
    "block_size": 16,
    "quantization": "dequantize",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("prefix-cache-on", {"num_kv_blocks": 64, "enable_prefix_caching": True}),
        ("prefix-cache-off", {"num_kv_blocks": 64, "enable_prefix_caching": False}),
        (
            "preempt-swap",
            {
                "num_kv_blocks": 9,
                "num_cpu_blocks": 32,
                "preemption_mode": "swap",
                "max_num_batched_tokens": 64,
            },
        ),
        (
            "preempt-recompute",
            {
                "num_kv_blocks": 9,
                "num_cpu_blocks": 0,
                "preemption_mode": "recompute",
                "max_num_batched_tokens": 64,
            },
        ),
    ],
)
def test_engine_greedy_matches_transformers(
    expected: list[list[int]], name: str, overrides: dict[str, Any]
) -> None:
    config = EngineConfig(**{"num_cpu_blocks": 8, **BASE, **overrides})  # type: ignore[arg-type]
    got, stats = anyio.run(run_engine, config)
    assert got == expected, name
    if name == "prefix-cache-on":
        assert stats.prefix_cache_hit_tokens >= 2 * 16  # the shared system prompt's full blocks
    if name == "prefix-cache-off":
        assert stats.prefix_cache_hit_tokens == 0
    if name == "preempt-swap":
        assert stats.num_preemptions_swap > 0
    if name == "preempt-recompute":
        assert stats.num_preemptions_recompute > 0 and stats.num_preemptions_swap == 0
