"""Tensor parallelism on the CPU (gloo, 2 worker processes): through the whole engine, a tiny
random model at tensor_parallel_size=2 streams the same greedy tokens as at 1, in fp32, for a
Qwen3 with one KV head (replicated on both ranks; q/k norm; untied lm_head) and a Qwen2 (KV
heads split; qkv bias; tied embeddings, so lm_head is the vocab-parallel embedding); a
killed worker fails the open request (and every later one) with a clear error and leaves no
worker behind; a clean close stops every worker, and so does the engine process dying. The
GPU case (NCCL, 2 GPUs) is marked and needs two devices."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, token_ids
from troupe import Engine, EngineConfig
from troupe.actors.engine import EngineStopped
from troupe.config import ConfigError
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.runner import build_runner
from troupe.gpu.tp_model import TPShard, check_tensor_parallel
from troupe.gpu.tp_runner import TPRunner
from troupe.messages import Delta, Failed, Finished, Rejected, SamplingParams

from tests.gpu.conftest import write_random_model

TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 96,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000.0,
}
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3": {"model_type": "qwen3", "num_key_value_heads": 1, "head_dim": 32},
    "qwen2": {"model_type": "qwen2", "num_key_value_heads": 2, "tie_word_embeddings": True},
}
PROMPTS = [[(11 * i + 7 * j + 3) % 256 for j in range(3 + 5 * i)] for i in range(3)]
MAX_TOKENS = [6, 4, 5]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tp")
    return {
        family: write_random_model(root / family, {**TINY, **FAMILIES[family]}, seed=1)
        for family in FAMILIES
    }


def _config(folder: Path, **changes: Any) -> EngineConfig:
    return EngineConfig(
        model=str(folder),
        device="cpu",
        dtype="float32",
        block_size=4,
        num_kv_blocks=64,
        max_num_seqs=4,
        max_num_batched_tokens=8,  # prompts prefill in chunks, beside the decodes
        max_model_len=64,
        **changes,
    )


async def _generate(engine: Engine, scores: list[list[float]] | None = None) -> list[list[int]]:
    """Each prompt's tokens; with `scores`, the first prompt's logprobs go there (every rank
    scores the prompt rows, rank 0 sends them)."""
    results: dict[int, list[Any]] = {}

    async def one(i: int) -> None:
        params = SamplingParams(
            max_tokens=MAX_TOKENS[i],
            temperature=0.0,
            ignore_eos=True,
            prompt_logprobs=1 if scores is not None and i == 0 else None,
        )
        results[i] = await collect(engine, PROMPTS[i], params)

    async with anyio.create_task_group() as tg:
        for i in range(len(PROMPTS)):
            tg.start_soon(one, i)
    for events in results.values():
        assert isinstance(terminal(events), Finished), events
    if scores is not None:
        first = results[0][0]
        assert isinstance(first, Delta | Finished) and first.prompt_logprobs is not None
        scores.append([entry.logprob for entry in first.prompt_logprobs])
    return [token_ids(results[i]) for i in range(len(PROMPTS))]


async def _reference(folder: Path, scores: list[list[float]] | None = None) -> list[list[int]]:
    async with Engine.open(_config(folder)) as engine:
        return await _generate(engine, scores)


def test_shard_ranges_and_checks() -> None:
    mqa = ModelConfig.from_hf_dict({**TINY, **FAMILIES["qwen3"]})
    rank1 = TPShard(rank=1, size=2, full=mqa)
    assert (rank1.first_head, rank1.num_heads) == (2, 2)
    assert (rank1.first_kv_head, rank1.num_kv_heads) == (0, 1)  # the one KV head, replicated
    assert (rank1.vocab_start, rank1.num_vocab_rows) == (128, 128)
    gqa = ModelConfig.from_hf_dict({**TINY, **FAMILIES["qwen2"], "vocab_size": 255})
    last = TPShard(rank=1, size=2, full=gqa)
    assert (last.first_kv_head, last.num_kv_heads) == (1, 1)
    assert (last.vocab_per_rank, last.num_vocab_rows) == (128, 127)  # one padding row
    with pytest.raises(ConfigError, match=r"tensor_parallel_size \(3\).*num_attention_heads \(4\)"):
        check_tensor_parallel(mqa, 3)
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ConfigError, match=r"\(3\).*num_key_value_heads \(2\)"):
        check_tensor_parallel(dataclasses.replace(gqa, num_heads=6), 3)
    with pytest.raises(ConfigError, match="runner 'model'"):
        EngineConfig(tensor_parallel_size=2, runner="fake")


def test_qwen3_one_kv_head_same_tokens_and_clean_close(models: dict[str, Path]) -> None:
    folder = models["qwen3"]
    with pytest.raises(ConfigError, match=r"\(3\).*num_attention_heads \(4\)"):
        build_runner(_config(folder, tensor_parallel_size=3))  # refused before any spawn
    scores: list[list[float]] = []
    expected = anyio.run(_reference, folder, scores)
    assert len({tuple(t) for t in expected}) == len(expected)  # distinct: not degenerate
    config = _config(folder, tensor_parallel_size=2)
    runner = build_runner(config)
    assert isinstance(runner, TPRunner)

    async def run() -> list[list[int]]:
        async with Engine.open(config, runner=runner) as engine:
            return await _generate(engine, scores)

    assert anyio.run(run) == expected
    one, two = scores
    assert len(one) == len(PROMPTS[0]) - 1 and two == pytest.approx(one, abs=1e-4)
    assert runner.statistics().num_steps > 0
    assert None not in runner.worker_exit_codes()  # closed with the engine, none left running


def test_qwen2_same_tokens_then_a_dead_worker_turns_the_engine_dead(
    models: dict[str, Path],
) -> None:
    folder = models["qwen2"]
    expected = anyio.run(_reference, folder)
    config = _config(folder, tensor_parallel_size=2)
    runner = TPRunner(config)
    dead = "engine dead: tensor-parallel worker failed: "
    seen: dict[str, Any] = {}

    async def run() -> None:
        async with Engine.open(config, runner=runner) as engine:
            assert await _generate(engine) == expected
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
            # rank 0 was stopped as soon as the failure was seen: no orphan
            seen["exit_codes"] = runner.worker_exit_codes()

    with pytest.raises(EngineStopped, match=dead):
        anyio.run(run)
    ends = seen["ends"]
    assert len(ends) == len(PROMPTS)
    assert any(isinstance(end, Failed) for end in ends)  # the step that found it dead
    for end in ends:  # in flight, or arrived once it was dead: each told why, once
        assert isinstance(end, Failed | Rejected) and end.message.startswith(dead), end
        assert "rank 1 exited with code -9" in end.message
    assert seen["healthy"] is False
    [late] = seen["late"]  # refused at once, naming the cause
    assert isinstance(late, Rejected) and late.message == ends[0].message
    assert all(code is not None for code in seen["exit_codes"])


@pytest.mark.gpu
def test_cuda_two_gpus_same_tokens(models: dict[str, Path]) -> None:
    """NCCL on two GPUs, eager and with CUDA graphs + overlap (the defaults), vs one GPU."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    for family in FAMILIES:
        base = _config(models[family]).replace(device="cuda")

        async def run(config: EngineConfig) -> list[list[int]]:
            async with Engine.open(config) as engine:
                return await _generate(engine)

        expected = anyio.run(run, base)
        assert anyio.run(run, base.replace(tensor_parallel_size=2, enforce_eager=True)) == expected
        assert anyio.run(run, base.replace(tensor_parallel_size=2)) == expected


ORPHAN_SCRIPT = """
import os, sys
from troupe import EngineConfig
from troupe.gpu.tp_runner import TPRunner
config = EngineConfig(model=sys.argv[1], device="cpu", dtype="float32", num_kv_blocks=16,
                      block_size=4, max_model_len=64, tensor_parallel_size=2)
runner = TPRunner(config)
print(" ".join(str(p) for p in runner.worker_pids()), flush=True)
os._exit(0)  # no close(), no atexit: as if the engine process were killed
"""


def _is_gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\\nState:\\tZ" in status  # exited, waiting for a reaper


def test_engine_process_death_stops_the_workers(models: dict[str, Path]) -> None:
    """Rank 0 reads the end of its pipe and stops every rank."""
    import subprocess
    import sys
    import time

    out = subprocess.run(
        [sys.executable, "-c", ORPHAN_SCRIPT, str(models["qwen3"])],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 120  # a hang detector only
    while not all(_is_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, f"workers {pids} still running"
        time.sleep(0.05)
