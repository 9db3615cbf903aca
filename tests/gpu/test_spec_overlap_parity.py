"""Speculation with no proposals costs the executor nothing (issue 10, point 4): the real
ModelRunner with the overlap schedule, driven synchronously by the scheduler and allocator
cores (no event loop, so no timing), gets the same StepPlans with n-gram speculation on as
off when nothing matches, and its overlapped steps hit exactly as often. On the CPU the
runner is built with overlap forced on (from a config it never overlaps there); on CUDA
(-m gpu) with decode and mixed-step graphs too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.speculator import SpecSettings
from troupe.actors.core.step_limits import StepLimits
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.runner import RunnerStats
from troupe.gpu.weights import load_model
from troupe.messages import AdmittedRequest, SamplingParams, StepPlan
from troupe.ops.bench_scheduler import CoreLoop
from troupe.spec_cost import SpecCost

BLOCKS = 128
K = 3


def _drive(folder: Path, device: str, spec: SpecSettings | None) -> tuple[Any, Any]:
    config, model = load_model(folder, torch.float32, torch.device(device), 128)
    options = RunnerOptions(
        block_size=4,
        num_gpu_blocks=BLOCKS,
        max_num_seqs=8,
        max_model_len=128,
        overlap_schedule=True,
        num_speculative_tokens=K,
        enforce_eager=device == "cpu",
        mixed_graph_tokens=0 if device == "cpu" else 64,
    )
    runner = ModelRunner(config, model, options)
    scheduler = SchedulerCore(
        StepLimits(
            block_size=4,
            num_gpu_blocks=BLOCKS,
            max_num_seqs=8,
            max_num_batched_tokens=64,
            num_lookahead_tokens=runner.num_lookahead_tokens,
        ),
        num_cpu_blocks=0,
        speculative=spec,
    )
    allocator = AllocatorCore(block_size=4, num_gpu_blocks=BLOCKS, num_cpu_blocks=0)
    loop = CoreLoop(scheduler, allocator, runner)  # type: ignore[arg-type]
    for i in range(6):
        prompt = tuple((37 * i + 11 * j) % 256 for j in range(9 + 2 * i))
        # sampled from a near-flat random model: no 3-gram recurs, nothing is proposed
        params = SamplingParams(max_tokens=20, temperature=1.0, seed=i, ignore_eos=True)
        loop.submit(
            [
                AdmittedRequest(
                    request_id=f"r{i}",
                    prompt_token_ids=prompt,
                    params=params,
                    arrival_time=0.0,
                    max_total_tokens=len(prompt) + 20,
                )
            ]
        )
    loop.run()
    stats: RunnerStats = runner.statistics()
    runner.close()
    return loop, stats


def _plans(loop: Any) -> list[StepPlan]:
    return list(loop.plans)


@pytest.fixture
def qwen3(hf_folder: Any) -> Path:
    folder, _ = hf_folder("qwen3", max_position_embeddings=128)
    return Path(folder)


def _check(qwen3: Path, device: str) -> None:
    off, off_stats = _drive(qwen3, device, None)
    spec = SpecSettings(num_tokens=K, min_n=3, max_n=4, cost=SpecCost(K))
    on, on_stats = _drive(qwen3, device, spec)
    assert on.scheduler.speculator.num_proposed == 0
    assert _plans(on) == _plans(off)
    assert dict(on.tokens) == dict(off.tokens)
    assert off_stats.num_overlap_hits > 0
    assert (on_stats.num_overlapped, on_stats.num_overlap_hits) == (
        off_stats.num_overlapped,
        off_stats.num_overlap_hits,
    )


def test_no_proposals_same_plans_and_overlap_cpu(qwen3: Path) -> None:
    _check(qwen3, "cpu")


@pytest.mark.gpu
def test_no_proposals_same_plans_and_overlap_cuda(qwen3: Path) -> None:
    _check(qwen3, "cuda")
