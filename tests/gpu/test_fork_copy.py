"""Parallel sampling on the model runner: the copy on write of a forked prompt's partial block
(KVCache.copy_blocks, StepPlan.copy_blocks) on the CPU and, with -m gpu, on the device; and
each sample of a forked request equals the same request run alone with its seed, through the
real scheduler, allocator and ModelRunner (tiny random model)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
import torch
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.step_limits import StepLimits
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.weights import load_model, qwen3_0_6b_config
from troupe.messages import AdmittedRequest, SamplingParams, StepResult, TokenBatch
from troupe.messages.allocator import Fork
from troupe.messages.samples import sample_id

from tests.actors.core.allocator_invariants import check_allocator

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
BS = 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_copy_blocks_copies_every_layer_k_and_v(device: str, dtype: torch.dtype) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    kv = KVCache(
        qwen3_0_6b_config(),
        num_gpu_blocks=6,
        num_cpu_blocks=0,
        block_size=BS,
        dtype=dtype,
        device=torch.device(device),
    )
    kv.gpu.copy_(torch.randint(0, 120, kv.gpu.shape, dtype=torch.uint8).to(kv.gpu.dtype))
    before = kv.gpu.clone()
    kv.copy_blocks([(1, 4), (1, 5), (2, 0)])
    for src, dst in ((1, 4), (1, 5), (2, 0)):
        assert torch.equal(kv.gpu[:, :, dst], before[:, :, src])
    for untouched in (1, 2, 3):
        assert torch.equal(kv.gpu[:, :, untouched], before[:, :, untouched])


def _runner(path: Any, device: str) -> ModelRunner:
    config, model = load_model(path, torch.float32, torch.device(device), 128)
    options = RunnerOptions(
        block_size=BS,
        num_gpu_blocks=96,
        num_cpu_blocks=32,
        max_num_seqs=8,
        max_model_len=128,
        enforce_eager=device == "cpu",
        overlap_schedule=device == "cuda",  # a fork step's copies never meet an overlapped step
    )
    return ModelRunner(config, model, options)


def _run(runner: ModelRunner, requests: list[tuple[str, list[int], SamplingParams]]) -> Any:
    """Scheduler + allocator + runner until idle: tokens per sequence id, and the Fork ops."""
    sched = SchedulerCore(
        StepLimits(
            block_size=BS,
            num_gpu_blocks=runner.num_gpu_blocks,
            max_num_seqs=8,
            max_num_batched_tokens=64,
            num_lookahead_tokens=runner.num_lookahead_tokens,
        ),
        num_cpu_blocks=runner.num_cpu_blocks,
        eos_token_ids=(),
    )
    alloc = AllocatorCore(
        block_size=BS, num_gpu_blocks=runner.num_gpu_blocks, num_cpu_blocks=runner.num_cpu_blocks
    )
    msgs = [
        AdmittedRequest(
            request_id=rid,
            prompt_token_ids=tuple(prompt),
            params=params,
            arrival_time=0.0,
            max_total_tokens=len(prompt) + params.max_tokens,
        )
        for rid, prompt, params in requests
    ]
    tokens: dict[str, list[int]] = defaultdict(list)
    forks: list[Fork] = []
    out = sched.handle(msgs)
    while out:
        replies = []
        for dest, msg in out:
            if dest == "allocator":
                forks += [op for op in msg.ops if isinstance(op, Fork)]
                replies.append(alloc.apply(msg))
                check_allocator(alloc)
            elif dest == "executor":
                sampled = runner.execute(msg)
                replies.append(StepResult(step_id=msg.step_id, time=0.0, sampled=sampled))
            elif isinstance(msg, TokenBatch):
                for o in msg.outputs:
                    tokens[o.request_id] += o.token_ids
        out = sched.handle(replies) if replies else []
    assert alloc.gpu.num_free == alloc.gpu.num_blocks and not alloc.seqs
    return tokens, forks


@pytest.mark.parametrize("device", DEVICES)
def test_forked_samples_equal_lone_runs_on_the_model_runner(hf_folder, device: str) -> None:  # type: ignore[no-untyped-def]
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    path, _ = hf_folder("llama")
    prompt = [(i * 37) % 250 + 3 for i in range(14)]  # 13 shared tokens: a partial block
    params = SamplingParams(n=3, max_tokens=10, seed=123, temperature=0.8)
    runner = _runner(path, device)  # one for all runs: ended requests leave no state in it
    tokens, forks = _run(runner, [("p", prompt, params)])
    assert len(forks) == 1 and forks[0].num_computed == 13
    for i in range(3):
        alone_params = SamplingParams(max_tokens=10, seed=123 + i, temperature=0.8)
        alone, _ = _run(runner, [(f"solo{i}", prompt, alone_params)])
        assert tokens[sample_id("p", i)] == alone[f"solo{i}"], i
    assert len({tuple(tokens[sample_id("p", i)]) for i in range(3)}) > 1
