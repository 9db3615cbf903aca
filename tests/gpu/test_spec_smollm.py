"""SmolLM2 (the default model, real weights) through the whole engine on the CPU with n-gram
speculation: greedy tokens identical to decoding without it, with prefix caching on and
preemption forced by a tiny KV pool; proposals are accepted; every block comes back."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.actors.graph import load_tokenizer_for
from troupe.messages import Finished

TEXTS = [
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with "
    "a single step.",
    "def area(r):\n    return 3.14159 * r * r\n\nprint(area(2))",
]
PARAMS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
# fp32 weights: a verification's k + 1 rows and a decode's one row round alike (the kept
# 4-bit path's packed kernel and its bf16 prefill GEMM need not, at near-ties)
BASE: dict[str, Any] = {
    "device": "cpu",
    "max_model_len": 256,
    "max_num_seqs": 4,
    "block_size": 16,
    "quantization": "dequantize",
}


def prompts() -> list[list[int]]:
    tok = load_tokenizer_for(None)
    return [
        tok.encode(
            tok.render_chat(
                [{"role": "user", "content": f"Repeat this text exactly:\n{text}"}],
                add_generation_prompt=True,
            ),
            add_special_tokens=False,
        )
        for text in TEXTS
    ]


async def run(config: EngineConfig) -> tuple[list[list[int]], Any]:
    results: dict[int, Any] = {}
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


@pytest.mark.slow
def test_ngram_speculation_is_token_identical() -> None:
    plain, _ = anyio.run(run, EngineConfig(**BASE, num_kv_blocks=64))
    config = EngineConfig(
        **BASE,
        num_kv_blocks=9,  # both requests' 70-odd tokens do not fit: preemption
        num_cpu_blocks=16,
        preemption_mode="swap",
        max_num_batched_tokens=64,
        speculative_method="ngram",
        num_speculative_tokens=5,
    )
    spec, stats = anyio.run(run, config)
    assert spec == plain
    assert stats.num_preemptions_swap > 0
    assert stats.prefix_cache_hit_tokens > 0  # the preempted request's prompt, at least
    # the model copies, but a full pool leaves proposals no room most steps (they never preempt)
    assert stats.num_spec_accepted_tokens >= 4
    assert stats.num_spec_accepted_tokens <= stats.num_spec_proposed_tokens
