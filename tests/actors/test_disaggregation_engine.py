"""Prefill/decode disaggregation through the whole engine, on the CPU: two spawned worker
processes (gloo) stream the same greedy tokens as one executor, for concurrent prompts of
several lengths in chunks (max_num_batched_tokens 8), under recompute preemption (a pool of
16 blocks), for a prefix-cache hit on blocks the prefill side wrote and for a multi-turn
prompt whose prefix the decode side wrote (its blocks travel back); every request ends once
and every block comes back. Seeded and unseeded sampling draw what one executor draws. A
killed worker fails the requests by name and takes its peer down. What the mode refuses is
refused by name. The worker checks look at the engine's own workers only: another child of this
process (the gateway tests' session server's engine process, when they ran first) is none of
theirs."""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
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
from troupe.gpu.weights import random_weights
from troupe.messages import Failed, Finished, Rejected, SamplingParams, StructuredOutputs

from tests.gpu.conftest import add_word_tokenizer

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000.0,
}
# four prompts at once: 3 to 22 tokens, in chunks of at most 8 beside the decodes
BATCH = [[(13 * i + 5 * j + 1) % 256 for j in range(3 + 6 * i)] for i in range(4)]
LONG = [(7 * j + 3) % 256 for j in range(20)]  # five full blocks


@pytest.fixture
def unrelated_child() -> Iterator[BaseProcess]:
    """A child of this process alive through the test, named as the gateway's engine process:
    what the session-scoped `server` of tests/gateway leaves running when those tests ran first."""
    child = multiprocessing.get_context("spawn").Process(
        target=time.sleep, args=(3600.0,), name="troupe-engine", daemon=True
    )
    child.start()
    yield child
    child.kill()
    child.join()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("pd") / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    weights = random_weights(ModelConfig.from_hf_dict(LLAMA), torch.float32, seed=3, std=0.2)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    add_word_tokenizer(folder)
    return folder


def _config(folder: Path, **changes: Any) -> EngineConfig:
    return EngineConfig(
        model=str(folder),
        device="cpu",
        dtype="float32",
        block_size=4,
        num_kv_blocks=16,  # 64 tokens: the batch below preempts (recompute)
        max_num_seqs=4,
        max_num_batched_tokens=8,
        max_model_len=64,
        preemption_mode="recompute",  # what disaggregation does; the same for the reference
        **changes,
    )


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def _one(engine: Engine, prompt: list[int], params: SamplingParams) -> list[int]:
    return (await _finished(engine, prompt, params))[0]


async def _finished(
    engine: Engine, prompt: list[int], params: SamplingParams
) -> tuple[list[int], int]:
    """The tokens and the prompt tokens the prefix cache served."""
    events = await collect(engine, prompt, params)
    end = terminal(events)
    assert isinstance(end, Finished), events  # exactly one terminal event
    return token_ids(events), end.usage.cached_tokens


async def _workload(engine: Engine) -> dict[str, Any]:
    """The batch (concurrent), then a long prompt, a prefix hit and a multi-turn follow-up."""
    out: dict[str, Any] = {}
    batch: dict[int, list[int]] = {}

    async def run(i: int) -> None:
        batch[i] = await _one(engine, BATCH[i], _greedy(12))

    async with anyio.create_task_group() as tg:
        for i in range(len(BATCH)):
            tg.start_soon(run, i)
    out["batch"] = [batch[i] for i in range(len(BATCH))]
    out["preempted"] = engine.stats().num_preemptions_recompute
    first = await _one(engine, LONG, _greedy(8))
    out["long"] = first
    # what the cache serves these two does not depend on when the batch's requests arrived
    # (that changes which of the batch's blocks recomputation finds): LONG's blocks are the
    # most recently freed
    out["hit"], hit_cached = await _finished(engine, [*LONG[:16], 1, 2, 3], _greedy(6))
    # the previous answer and a new turn: its blocks were written by the decode side
    out["turn"], turn_cached = await _finished(engine, [*LONG, *first, 9, 8, 7], _greedy(6))
    out["cached"] = (hit_cached, turn_cached)
    seeded = SamplingParams(max_tokens=6, temperature=0.8, seed=11, ignore_eos=True)
    out["seeded"] = await _one(engine, BATCH[1], seeded)
    # penalties read the history, which moves with the request (SeqWork.history): a prompt
    # of tokens the model likes (an answer above), no prefix hit (it starts anew)
    penalized = SamplingParams(max_tokens=8, temperature=0.0, repetition_penalty=3.0)
    out["penalized"] = await _one(engine, [250, *out["batch"][0]], penalized)
    # no seed: the engine's seed stream, drawn by the phase router as one executor draws it
    out["unseeded"] = await _one(engine, BATCH[2], SamplingParams(max_tokens=6, temperature=0.8))
    await wait_blocks_free(engine)
    out["hits"] = engine.stats().prefix_cache_hit_tokens
    return out


async def _disaggregated(config: EngineConfig) -> tuple[dict[str, Any], Any]:
    before = _children()
    async with Engine.open(config) as engine:
        got = await _workload(engine)
        stats = engine.runner_stats()  # the decode side's
        # n > 1 and structured output are refused per request, naming the field
        end = terminal(await collect(engine, [1, 2], SamplingParams(max_tokens=2, n=2)))
        assert isinstance(end, Rejected) and end.field == "n", end
        assert "n must be <= 1 (disaggregation 'prefill_decode'" in end.message
        spec = StructuredOutputs(regex="[ab]+")
        params = SamplingParams(max_tokens=2, structured_outputs=spec)
        end = terminal(await collect(engine, [1], params))
        assert isinstance(end, Rejected) and end.field == "structured_outputs", end
        workers = _workers(before)
    # closed cleanly: both sides left their group and exited 0
    assert {name: p.exitcode for name, p in workers.items()} == {
        "troupe-prefill": 0,
        "troupe-decode": 0,
    }
    return got, stats


def _children() -> frozenset[BaseProcess]:
    return frozenset(multiprocessing.active_children())


def _workers(before: frozenset[BaseProcess]) -> dict[str, BaseProcess]:
    """The live disaggregation workers started since `before`: the engine's own."""
    names = ("troupe-prefill", "troupe-decode")
    return {p.name: p for p in _children() - before if p.name in names}


async def _kill_a_worker(config: EngineConfig, before: frozenset[BaseProcess]) -> None:
    dead = "engine dead: disaggregation worker failed: the prefill worker "
    with pytest.raises(EngineStopped, match=dead):  # a dead worker turns the engine dead
        async with Engine.open(config) as engine:
            assert await _one(engine, BATCH[0], _greedy(2))
            workers = _workers(before)
            workers["troupe-prefill"].kill()
            # the step that finds it dead fails its request; the next one is refused at once
            for kind in (Failed, Rejected):
                end = terminal(await collect(engine, [1, 2, 3], _greedy(2)))
                assert isinstance(end, kind), end
                # whichever the engine notices first: the exit or the closed pipe
                assert end.message.startswith(dead), end
                assert "exited" in end.message or "closed its pipe" in end.message
                await engine.wait_stopped()
            assert not engine.is_healthy
            assert workers["troupe-decode"].exitcode is not None  # stopped with it: no orphan


async def _colocated(config: EngineConfig) -> dict[str, Any]:
    async with Engine.open(config) as engine:
        return await _workload(engine)


def test_same_tokens_as_one_executor(model: Path, unrelated_child: BaseProcess) -> None:
    expected = anyio.run(_colocated, _config(model))
    got, stats = anyio.run(_disaggregated, _config(model, disaggregation="prefill_decode"))
    assert expected["preempted"] > 0 and got["preempted"] > 0
    assert expected["hits"] > 0 and got["hits"] > 0
    assert expected["cached"][0] == 16 and got["cached"] == expected["cached"]
    assert expected["cached"][1] > 16
    assert len({tuple(t) for t in expected["batch"]}) == len(BATCH)  # not degenerate
    for key in ("batch", "long", "hit", "turn", "seeded", "penalized", "unseeded"):
        assert got[key] == expected[key], key
    assert stats.num_kv_blocks_received > 0  # prefill -> decode
    assert stats.num_kv_blocks_sent > 0  # decode -> prefill: the multi-turn prompt's blocks


def test_a_dead_worker_fails_requests_by_name(model: Path, unrelated_child: BaseProcess) -> None:
    before = _children()
    anyio.run(_kill_a_worker, _config(model, disaggregation="prefill_decode"), before)
    assert _workers(before) == {}
    assert unrelated_child.is_alive()  # not one of the engine's: left alone


def test_refused_combinations_name_their_field() -> None:
    pd = {"disaggregation": "prefill_decode"}
    with pytest.raises(ConfigError, match="speculative_method must be None"):
        EngineConfig(speculative_method="ngram", **pd)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="preemption_mode must be 'auto' or 'recompute'"):
        EngineConfig(preemption_mode="swap", **pd)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="streaming_window must be 0"):
        EngineConfig(streaming_window=64, **pd)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="tensor_parallel_size must be 1"):
        EngineConfig(tensor_parallel_size=2, **pd)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="disaggregation must be one of"):
        EngineConfig(disaggregation="both")  # type: ignore[arg-type]


@pytest.mark.gpu
def test_cuda_two_gpus_nccl_same_tokens(model: Path) -> None:
    """NCCL between cuda:0 (prefill) and cuda:1 (decode), eager and with CUDA graphs and the
    decode side's overlapped steps (the defaults), against one GPU."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    base = _config(model).replace(device="cuda")
    expected = anyio.run(_colocated, base)
    for changes in ({"enforce_eager": True}, {}):
        config = base.replace(disaggregation="prefill_decode", **changes)
        got, stats = anyio.run(_disaggregated, config)
        for key in ("batch", "long", "hit", "turn", "seeded", "penalized", "unseeded"):
            assert got[key] == expected[key], (key, changes)
        assert stats.num_kv_blocks_received > 0 and stats.num_kv_blocks_sent > 0
