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
from troupe import EngineConfig, SamplingParams, prompt_embeds_of

from tests.gpu.conftest import add_word_tokenizer, make_hf_model
from tests.gpu.test_prompt_embeds_engine import run_all

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
    got = anyio.run(run_all, config, inputs, PARAMS)[0]
    assert got[: len(PROMPTS)] == got[len(PROMPTS) :]
    assert len(set(got[0])) > 2  # not stuck on one token
