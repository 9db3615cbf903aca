"""Gemma (1: Gemma 2B/7B, CodeGemma): Llama's pre-norm layer with Gemma's (1 + weight) norms,
embeddings times sqrt(hidden) and a tanh-GeGLU MLP, the softmax scaled by head_dim's root. A
random checkpoint transformers saves (norm weights drawn away from 0, so each lands in its
place) is greedy token-identical to transformers (fp32) through chunked prefill: on the CPU, on
the Triton ops under the interpreter and on CUDA; and it splits over two tensor-parallel
ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import PROMPTS, TINY, assert_greedy_matches, saved_family

# head_dim 32 apart from hidden / heads (16), as Gemma 7B's 256 is apart from 3072 / 16;
# untied: tied, the embedding (x 8) echoes the last token
TINY_GEMMA = {**TINY, "head_dim": 32, "rope_theta": 1000.0, "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("gemma")
    return folder, saved_family(folder, "Gemma", TINY_GEMMA)


def test_config_reads_as_transformers_builds_it(gemma: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError

    config = ModelConfig.from_hf_folder(gemma[0])
    assert config.is_gemma and not config.sandwich_norms and config.hidden_act == "gelu_tanh"
    assert config.query_pre_attn_scalar is None and config.head_dim == 32
    assert not config.layer_windows and config.attn_logit_softcapping is None
    legacy = {**gemma[1].config.to_dict(), "hidden_act": "gelu", "hidden_activation": None}
    assert ModelConfig.from_hf_dict(legacy).hidden_act == "gelu_tanh"  # transformers' reading
    with pytest.raises(ModelLoadError, match="hidden_activation 'relu'"):
        ModelConfig.from_hf_dict({**legacy, "hidden_act": "relu"})


def test_greedy_matches_hf_with_chunked_prefill(gemma: tuple[Path, Any]) -> None:
    assert_greedy_matches(*gemma)


def test_triton_ops_match_hf(gemma: tuple[Path, Any], mt: Any) -> None:
    folder, hf_model = gemma
    expected = [mt.hf_greedy(hf_model, p, 3) for p in PROMPTS]  # interpreter time
    driver = mt.PlanDriver(mt.runner_for(folder, backend="triton"), chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(3)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected


def test_two_ranks_stream_the_same_tokens(gemma: tuple[Path, Any]) -> None:
    import anyio

    from tests.gpu.conftest import add_word_tokenizer
    from tests.gpu.test_tensor_parallel import _config, _generate

    folder = gemma[0]
    add_word_tokenizer(folder)

    async def tokens(tp: int) -> list[list[int]]:
        from troupe import Engine

        async with Engine.open(_config(folder, tensor_parallel_size=tp)) as engine:
            return await _generate(engine)

    assert anyio.run(tokens, 2) == anyio.run(tokens, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(gemma: tuple[Path, Any]) -> None:
    assert_greedy_matches(*gemma, device="cuda")
