"""Input embeddings instead of a prompt (EngineConfig.enable_prompt_embeds), through the whole
engine on the CPU with the real default model (SmolLM2, dequantized to fp32 as transformers
runs it): the token embeddings of a prompt give that prompt's greedy tokens, in small chunks
and across preemption by recompute; random rows give transformers' own greedy tokens for
`generate(inputs_embeds=...)`; the prefix cache shares blocks between identical rows only; and
every block comes back. The chunked run, the random rows and the prefix cache share one
engine (each engine here loads and dequantizes the model; the steps of a batch cost what one
request's do)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, collect_all, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams, prompt_embeds_of
from troupe.actors.graph import load_tokenizer_for
from troupe.messages import Finished

NUM_NEW = 16
PARAMS = SamplingParams(max_tokens=NUM_NEW, temperature=0.0, ignore_eos=True)
TEXTS = [
    "The theatre troupe arrived in town and",
    "Three primary colors are red, yellow and",
    "In the beginning the universe was created. This has made a lot of people",
]
BASE: dict[str, Any] = {
    "device": "cpu",
    "max_model_len": 256,
    "max_num_seqs": 4,
    "block_size": 16,
    "quantization": "dequantize",
    "enable_prompt_embeds": True,
}

pytestmark = pytest.mark.slow


def prompts() -> list[list[int]]:
    tok = load_tokenizer_for(None)
    return [tok.encode(text, add_special_tokens=True) for text in TEXTS]


def token_embeds(hf: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = hf.get_input_embeddings()(torch.tensor(ids))
    return out


def random_embeds(hf: Any, num_rows: int, seed: int) -> torch.Tensor:
    """Rows no token has: normal values at the embedding table's scale."""
    scale = float(hf.get_input_embeddings().weight.detach().std())
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, hf.config.hidden_size, generator=gen) * scale


def hf_greedy(hf: Any, *, ids: list[int] | None = None, embeds: torch.Tensor | None = None) -> Any:
    with torch.no_grad():
        if embeds is not None:  # generate() returns the new tokens only
            out = hf.generate(
                inputs_embeds=embeds[None],
                attention_mask=torch.ones(1, len(embeds), dtype=torch.long),
                max_new_tokens=NUM_NEW,
                do_sample=False,
                pad_token_id=0,
            )
            return out[0].tolist()
        assert ids is not None
        out = hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=NUM_NEW,
            do_sample=False,
            pad_token_id=0,
        )
        return out[0, len(ids) :].tolist()


async def run_together(
    engine: Engine, inputs: list[Any], params: SamplingParams = PARAMS
) -> list[list[int]]:
    """Every input at once; each one's tokens, once every block is back."""
    results = await collect_all(engine, [(prompt, params) for prompt in inputs])
    await wait_blocks_free(engine, timeout=60)
    for events in results:
        assert isinstance(terminal(events), Finished), terminal(events)
    return [token_ids(events) for events in results]


async def run_all(
    config: EngineConfig, inputs: list[Any], params: SamplingParams = PARAMS
) -> tuple[list[list[int]], Any]:
    """run_together on an engine of its own; the tokens, and the stats at the end."""
    async with Engine.open(config) as engine:
        return await run_together(engine, inputs, params), engine.stats()


@pytest.fixture(scope="module")
def expected(hf_smollm: Any) -> list[list[int]]:
    return [hf_greedy(hf_smollm, ids=p) for p in prompts()]


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        # (chunks of 8 rows without preemption: test_chunked_rows_random_rows_and_the_prefix_cache)
        # 4 blocks for three requests that grow past two each: someone is freed and recomputed
        (
            "preempt-recompute",
            {
                "num_kv_blocks": 5,
                "num_cpu_blocks": 0,
                "preemption_mode": "recompute",
                "max_num_batched_tokens": 32,
            },
        ),
        ("preempt-swap", {"num_kv_blocks": 5, "num_cpu_blocks": 16, "preemption_mode": "swap"}),
    ],
)
def test_token_embeddings_give_the_prompts_tokens(
    hf_smollm: Any, expected: list[list[int]], name: str, overrides: dict[str, Any]
) -> None:
    embeds = [prompt_embeds_of(token_embeds(hf_smollm, p)) for p in prompts()]
    config = EngineConfig(**{**BASE, **overrides})
    got, stats = anyio.run(run_all, config, [*embeds, *prompts()])
    assert got[: len(embeds)] == expected, name  # the rows, as transformers runs the ids
    assert got[len(embeds) :] == expected, name  # beside them, the ids themselves
    if name.startswith("preempt-recompute"):
        assert stats.num_preemptions_recompute > 0
    if name == "preempt-swap":
        assert stats.num_preemptions_swap > 0
    assert stats.num_gpu_blocks_used == 0 and stats.num_cpu_blocks_used == 0


def test_chunked_rows_random_rows_and_the_prefix_cache(
    hf_smollm: Any, expected: list[list[int]]
) -> None:
    """One engine, prompts cut in chunks of 8 rows beside others' decodes. First, together:
    each prompt's token embeddings and its ids give transformers' tokens for the ids; random
    rows (5 and 23) give transformers' own greedy tokens for `generate(inputs_embeds=...)`, and
    so do bf16 rows (cast to the model's fp32 by the runner). Then, one at a time: the same 40
    rows twice, the second hitting the first's two full blocks; then other rows of the same
    length (so the same placeholder ids), looked up while those blocks are cached, hit
    nothing. (On the CPU freed cached blocks are reused first, so the order matters.)"""
    embeds = [prompt_embeds_of(token_embeds(hf_smollm, p)) for p in prompts()]
    rows = [random_embeds(hf_smollm, n, seed) for seed, n in enumerate((5, 23))]
    bf16 = rows[0].to(torch.bfloat16)
    want_rows = [hf_greedy(hf_smollm, embeds=r) for r in (*rows, bf16.float())]
    a, b = (prompt_embeds_of(random_embeds(hf_smollm, 40, seed)) for seed in (7, 8))
    config = EngineConfig(**{**BASE, "num_kv_blocks": 64, "max_num_batched_tokens": 8})

    async def main() -> tuple[list[list[int]], list[int], Any]:
        async with Engine.open(config) as engine:
            inputs = [*embeds, *prompts(), *(prompt_embeds_of(r) for r in (*rows, bf16))]
            got = await run_together(engine, inputs)
            cached = []
            for prompt in (a, a, b):  # one token each: the lookups are the point
                events = await collect(engine, prompt, SamplingParams(max_tokens=1))
                end = terminal(events)
                assert isinstance(end, Finished) and end.usage is not None
                cached.append(end.usage.cached_tokens)
                await wait_blocks_free(engine, timeout=60)
            return got, cached, engine.stats()

    got, cached, stats = anyio.run(main)
    assert got[: len(embeds)] == expected  # the rows, as transformers runs the ids
    assert got[len(embeds) : 2 * len(embeds)] == expected  # beside them, the ids themselves
    assert got[2 * len(embeds) :] == want_rows
    assert cached == [0, 32, 0]
    assert stats.num_gpu_blocks_used == 0 and stats.num_cpu_blocks_used == 0
