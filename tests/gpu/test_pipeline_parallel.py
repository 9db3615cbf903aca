"""Pipeline parallelism on the CPU (gloo, 2 stage processes): through the whole engine, tiny
random models at pipeline_parallel_size=2 stream the same greedy tokens as in one process, in
fp32, with chunked prefill and preemptions (swap, then recompute), prompt logprobs within 1e-4,
and every block back; a Qwen3 (untied lm_head, 3 layers: vLLM's split [2, 1]) and a Llama
(tied embeddings: the last stage reads the embedding as its head; explicit partition "1,3").
A killed stage fails the open requests once each and refuses new ones; what does not split is
refused before any process is spawned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig
from troupe.actors.engine import EngineStopped
from troupe.config import ConfigError
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.pp_runner import PPRunner
from troupe.gpu.pp_stage import PPStage, stage_sizes
from troupe.gpu.runner import build_runner
from troupe.gpu.weights import random_weights
from troupe.messages import Delta, EngineStats, Failed, Finished, Rejected, SamplingParams

from tests.gpu.conftest import write_random_model

TINY = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000.0,
}
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3": {"model_type": "qwen3", "num_hidden_layers": 3, "head_dim": 32},
    "llama": {"model_type": "llama", "num_hidden_layers": 4, "tie_word_embeddings": True},
}
PROMPTS = [[(11 * i + 7 * j + 3) % 256 for j in range(6 + 3 * i)] for i in range(4)]
MAX_TOKENS = [12, 9, 11, 10]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pp")
    return {
        family: write_random_model(root / family, {**TINY, **FAMILIES[family]}, seed=2)
        for family in FAMILIES
    }


def _config(folder: Path, **changes: Any) -> EngineConfig:
    return EngineConfig(
        model=str(folder),
        device="cpu",
        dtype="float32",
        block_size=4,
        num_kv_blocks=12,  # 48 tokens for ~90: preemptions
        num_cpu_blocks=12,
        max_num_seqs=4,
        max_num_batched_tokens=8,  # prompts prefill in chunks, beside the decodes
        max_model_len=64,
        enable_prefix_caching=False,
        **changes,
    )


async def _generate(
    engine: Engine, scores: list[list[float]]
) -> tuple[list[list[int]], EngineStats]:
    """Each prompt's greedy tokens (the first prompt's logprobs appended to `scores`), and the
    stats once every block is back."""
    results: dict[int, list[Any]] = {}

    async def one(i: int) -> None:
        params = SamplingParams(
            max_tokens=MAX_TOKENS[i],
            temperature=0.0,
            ignore_eos=True,
            prompt_logprobs=1 if i == 0 else None,
        )
        results[i] = await collect(engine, PROMPTS[i], params)

    async with anyio.create_task_group() as tg:
        for i in range(len(PROMPTS)):
            tg.start_soon(one, i)
    for events in results.values():
        assert isinstance(terminal(events), Finished), events
    first = results[0][0]
    assert isinstance(first, Delta | Finished) and first.prompt_logprobs is not None
    scores.append([entry.logprob for entry in first.prompt_logprobs])
    await wait_blocks_free(engine, timeout=60)
    return [token_ids(results[i]) for i in range(len(PROMPTS))], engine.stats()


async def _run(
    config: EngineConfig, scores: list[list[float]]
) -> tuple[list[list[int]], EngineStats]:
    async with Engine.open(config) as engine:
        return await _generate(engine, scores)


def _same_as_one_process(config: EngineConfig, mode: str) -> None:
    scores: list[list[float]] = []
    expected, one = anyio.run(
        _run, config.replace(pipeline_parallel_size=1, pipeline_layer_partition=None), scores
    )
    assert len({tuple(t) for t in expected}) == len(expected)  # distinct: not degenerate
    assert getattr(one, f"num_preemptions_{mode}") > 0
    tokens, stats = anyio.run(_run, config, scores)
    assert tokens == expected
    assert getattr(stats, f"num_preemptions_{mode}") > 0
    assert stats.num_gpu_blocks_used == 0 and stats.num_cpu_blocks_used == 0
    reference, staged = scores
    assert len(reference) == len(PROMPTS[0]) - 1
    assert staged == pytest.approx(reference, abs=1e-4)


def test_stage_split_and_refusals(models: dict[str, Path]) -> None:
    assert stage_sizes(7, 4) == (2, 2, 2, 1)  # vLLM's: the spare layers before the last stage
    assert stage_sizes(4, 2) == (2, 2) and stage_sizes(4, 2, "1,3") == (1, 3)
    full = ModelConfig.from_hf_dict({**TINY, **FAMILIES["qwen3"]})
    last = PPStage.of(full, 1, 2, None)
    assert (last.first_layer, last.end_layer, last.is_last) == (2, 3, True)
    assert last.layer_config(full).num_layers == 1
    assert (
        last.local_layer("model.layers.2.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    )
    assert last.local_layer("model.layers.1.mlp.up_proj.weight") is None
    with pytest.raises(ConfigError, match=r"pipeline_parallel_size \(4\).*num_hidden_layers \(3\)"):
        build_runner(_config(models["qwen3"], pipeline_parallel_size=4))  # before any spawn
    with pytest.raises(ConfigError, match="sums to 3, the model has num_hidden_layers 4"):
        build_runner(
            _config(models["llama"], pipeline_parallel_size=2, pipeline_layer_partition="1,2")
        )
    with pytest.raises(ConfigError, match="every stage needs a layer"):
        stage_sizes(4, 2, "0,4")
    with pytest.raises(ConfigError, match="pipeline_parallel_size must be an integer >= 1"):
        EngineConfig(pipeline_parallel_size=0)
    with pytest.raises(ConfigError, match="2 comma-separated layer counts"):
        EngineConfig(pipeline_parallel_size=2, pipeline_layer_partition="1,2,3")
    with pytest.raises(ConfigError, match="needs pipeline_parallel_size > 1"):
        EngineConfig(pipeline_layer_partition="2")
    refused = {
        "tensor_parallel_size": 2,
        "speculative_method": "ngram",
        "enable_lora": True,
        "runner": "fake",
        "enable_sleep_mode": True,
    }
    for field, value in refused.items():
        with pytest.raises(
            ConfigError, match=rf"^{field} must be .* with pipeline_parallel_size 2"
        ):
            EngineConfig(pipeline_parallel_size=2, **{field: value})


def test_qwen3_same_tokens_and_logprobs_with_chunks_and_swaps(models: dict[str, Path]) -> None:
    _same_as_one_process(
        _config(models["qwen3"], pipeline_parallel_size=2, preemption_mode="swap"), "swap"
    )


def test_llama_recompute_then_a_dead_stage_turns_the_engine_dead(models: dict[str, Path]) -> None:
    folder = models["llama"]
    config = _config(
        folder,
        pipeline_parallel_size=2,
        pipeline_layer_partition="1,3",
        preemption_mode="recompute",
    )
    scores: list[list[float]] = []
    expected, one = anyio.run(
        _run, config.replace(pipeline_parallel_size=1, pipeline_layer_partition=None), scores
    )
    assert one.num_preemptions_recompute > 0
    runner = build_runner(config)
    assert isinstance(runner, PPRunner)
    dead = "engine dead: pipeline stage failed: "
    seen: dict[str, Any] = {}

    async def run() -> None:
        async with Engine.open(config, runner=runner) as engine:
            tokens, stats = await _generate(engine, scores)
            seen["tokens"], seen["stats"] = tokens, stats
            assert engine.is_healthy
            runner.kill_worker(1)
            results: list[list[Any]] = []

            async def one(prompt: list[int]) -> None:
                results.append(await collect(engine, prompt, SamplingParams(max_tokens=3)))

            async with anyio.create_task_group() as tg:  # in flight when the step finds it
                for prompt in PROMPTS:
                    tg.start_soon(one, prompt)
            await engine.wait_stopped()
            seen["ends"] = [terminal(events) for events in results]
            seen["healthy"] = engine.is_healthy
            seen["late"] = await collect(engine, PROMPTS[0], SamplingParams(max_tokens=3))
            seen["exit_codes"] = runner.worker_exit_codes()

    with pytest.raises(EngineStopped, match=dead):
        anyio.run(run)
    assert seen["tokens"] == expected
    assert seen["stats"].num_preemptions_recompute > 0
    reference, staged = scores
    assert staged == pytest.approx(reference, abs=1e-4)
    ends = seen["ends"]
    assert len(ends) == len(PROMPTS)
    assert any(isinstance(end, Failed) for end in ends)  # the step that found it dead
    for end in ends:  # in flight, or arrived once it was dead: each told why, once
        assert isinstance(end, Failed | Rejected) and end.message.startswith(dead), end
        assert "stage 1 exited with code -9" in end.message
    assert seen["healthy"] is False
    [late] = seen["late"]
    assert isinstance(late, Rejected) and late.message == ends[0].message
    assert all(code is not None for code in seen["exit_codes"])  # stage 0 stopped too


def test_gemma3_gguf_stages_equal_transformers(
    tmp_path_factory: pytest.TempPathFactory, mt: Any
) -> None:
    """A GGUF file (dequantized per stage), Gemma 3's scaled embedding on stage 0, five
    windowed layers then a global one split [3, 3]: stage 0 holds only windowed layers, yet no
    block the global layer reads is released (the engine's kv_window is 0)."""
    transformers = pytest.importorskip("transformers")
    from tests.gpu.test_gemma_gguf import _hf_config, _write_gguf

    weights = random_weights(
        ModelConfig.from_hf_dict(_hf_config().to_dict()), torch.float32, seed=3, std=0.2
    )
    path = tmp_path_factory.mktemp("pp-gemma3") / "tiny-gemma3.gguf"
    _write_gguf(path, weights)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    prompts = [[2, 300, 301, 290, 277, 281, 299, 300, 305, 288, 270], [2, 295, 296, 297]]
    expected = [mt.hf_greedy(hf_model, p, 10) for p in prompts]
    config = EngineConfig(
        model=str(path),
        device="cpu",
        dtype="float32",
        block_size=4,
        num_kv_blocks=16,
        max_num_seqs=4,
        max_num_batched_tokens=8,
        max_model_len=64,
        pipeline_parallel_size=2,
    )
    runner = build_runner(config)
    assert isinstance(runner, PPRunner) and runner.kv_window == 0

    async def run() -> list[list[int]]:
        async with Engine.open(config, runner=runner) as engine:
            ends: list[list[int]] = [[], []]

            async def one(i: int) -> None:
                params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
                ends[i] = token_ids(await collect(engine, prompts[i], params))

            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            await wait_blocks_free(engine, timeout=60)
            return ends

    assert anyio.run(run) == expected
    assert len(set(expected[0])) > 2  # the model is not stuck on one token
