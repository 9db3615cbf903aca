"""Input embeddings on CUDA (gpu/embed_rows.py): a tiny random Qwen3 in fp32 whose prompts are
given as their own token embeddings gives the ids' greedy tokens through mixed-step CUDA
graphs (the captured mask/value buffers, filled before each replay), split chunks beside
decodes, and eager steps; every block comes back. Never run on CPU (the graphs are CUDA's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams, prompt_embeds_of
from troupe.messages import Finished

from tests.gpu.conftest import add_word_tokenizer, make_hf_model

pytestmark = pytest.mark.gpu
PROMPTS = [[(7 * i + 3 * j) % 256 for j in range(9 + 6 * i)] for i in range(4)]
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("embeds") / "qwen3"
    hf = make_hf_model("qwen3", max_position_embeddings=128)
    hf.save_pretrained(folder)
    add_word_tokenizer(folder)
    return folder, hf


async def _run(config: EngineConfig, inputs: list[Any]) -> list[list[int]]:
    results: dict[int, list[Any]] = {}
    async with Engine.open(config) as engine:

        async def one(i: int, prompt: Any) -> None:
            results[i] = await collect(engine, prompt, PARAMS)

        async with anyio.create_task_group() as tg:
            for i, prompt in enumerate(inputs):
                tg.start_soon(one, i, prompt)
        await wait_blocks_free(engine, timeout=60)
    for events in results.values():
        assert isinstance(terminal(events), Finished), terminal(events)
    return [token_ids(results[i]) for i in range(len(inputs))]


@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_token_embeddings_give_the_ids_tokens_on_cuda(model: tuple[Path, Any], eager: bool) -> None:
    folder, hf = model
    with torch.no_grad():
        rows = [hf.get_input_embeddings()(torch.tensor(p)) for p in PROMPTS]
    config = EngineConfig(
        model=str(folder), device="cuda", dtype="float32", max_model_len=128, block_size=4,
        num_kv_blocks=96, max_num_seqs=8, max_num_batched_tokens=8, enforce_eager=eager,
        enable_prompt_embeds=True,
    )  # fmt: skip
    inputs = [prompt_embeds_of(r) for r in rows] + PROMPTS
    got = anyio.run(_run, config, inputs)
    assert got[: len(PROMPTS)] == got[len(PROMPTS) :]
    assert len(set(got[0])) > 2  # not stuck on one token
