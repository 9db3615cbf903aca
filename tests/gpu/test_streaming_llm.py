"""StreamingLLM mode (issue 12, point 3) on tiny random models on the CPU: the scheduler, the
allocator and the real model runner wired together (ops.bench_scheduler.CoreLoop) generate far
past max_model_len in a pool a fraction of the request's size; at every step the logits equal
those of a plain torch StreamingLLM decoder (gpu/streaming_reference.py: keys before rotary,
re-rotated at cache positions each step), and the blocks held never pass sinks + window."""

from __future__ import annotations

import pytest
import torch
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.step_limits import StepLimits
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.streaming_reference import StreamingReference
from troupe.gpu.weights import build_model, random_weights
from troupe.messages import AdmittedRequest, SamplingParams
from troupe.ops.bench_scheduler import CoreLoop

from tests.actors.core.allocator_invariants import check_allocator
from tests.gpu.conftest import FAMILIES, TINY

BS, SINKS, WINDOW, CHUNK = 4, 4, 16, 8
MAX_MODEL_LEN = 64


def tiny_model(family: str) -> torch.nn.Module:
    hf = {**TINY, **FAMILIES[family], "model_type": family, "max_position_embeddings": 1024}
    config = ModelConfig.from_hf_dict(hf)
    weights = random_weights(config, torch.float32, seed=3, std=0.2)
    return build_model(config, weights.items(), torch.float32, torch.device("cpu"), 1024)


class Captured:
    """The logits hook: every sampled row's logits, per request, in step order."""

    def __init__(self) -> None:
        self.rows: dict[str, list[torch.Tensor]] = {}

    def __call__(self, request_ids: object, logits: torch.Tensor) -> None:
        for i, rid in enumerate(request_ids):  # type: ignore[attr-defined]
            self.rows.setdefault(rid, []).append(logits[i].clone())


def _run(
    family: str,
    lengths: list[tuple[int, int]],
    *,
    num_gpu_blocks: int,
    num_cpu_blocks: int = 0,
    mode: str = "auto",
) -> tuple[CoreLoop, Captured, list[int], torch.nn.Module, list[AdmittedRequest]]:
    model = tiny_model(family)
    captured = Captured()
    options = RunnerOptions(
        block_size=BS,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        max_num_seqs=4,
        max_model_len=MAX_MODEL_LEN,
        max_stream_len=1024,
    )
    runner = ModelRunner(model.config, model, options, logits_hook=captured)
    scheduler = SchedulerCore(
        StepLimits(
            block_size=BS,
            num_gpu_blocks=num_gpu_blocks,
            max_num_seqs=4,
            max_num_batched_tokens=CHUNK,
            enable_prefix_caching=True,
        ),
        num_cpu_blocks=num_cpu_blocks,
        preemption_mode=mode,
        eos_token_ids=(),
    )
    allocator = AllocatorCore(
        block_size=BS, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks
    )
    held: list[int] = []

    def check(alloc: AllocatorCore) -> None:
        check_allocator(alloc)
        held.append(alloc.gpu.num_blocks - alloc.gpu.num_free)  # num_free counts cached-free

    loop = CoreLoop(scheduler, allocator, runner, check=check)  # type: ignore[arg-type]
    params = SamplingParams(
        temperature=0.0, ignore_eos=True, streaming_window=WINDOW, sink_tokens=SINKS
    )
    requests = [
        AdmittedRequest(
            request_id=f"r{i}",
            prompt_token_ids=tuple((17 * i + 5 * j) % 256 for j in range(prompt)),
            params=msgspec_replace(params, max_tokens=out),
            arrival_time=0.0,
            max_total_tokens=prompt + out,
        )
        for i, (prompt, out) in enumerate(lengths)
    ]
    loop.submit(requests)
    loop.run()
    assert loop.num_refused == 0
    assert allocator.gpu.num_free == num_gpu_blocks and not allocator.seqs  # every block back
    return loop, captured, held, model, requests


def msgspec_replace(params: SamplingParams, **changes: object) -> SamplingParams:
    import msgspec

    return msgspec.structs.replace(params, **changes)


def _check_logits(
    loop: CoreLoop, captured: Captured, model: torch.nn.Module, req: AdmittedRequest
) -> None:
    """The engine's logits at every sampled step equal the reference's after that token."""
    rid = req.request_id
    tokens = list(req.prompt_token_ids) + loop.tokens[rid]
    assert len(loop.tokens[rid]) == req.params.max_tokens
    rows = captured.rows[rid]
    ref = StreamingReference(model, sink_tokens=SINKS, window=WINDOW)  # type: ignore[arg-type]
    for i, token in enumerate(tokens[:-1]):
        logits = ref.step(token)
        step = i - (len(req.prompt_token_ids) - 1)
        if step >= 0:
            torch.testing.assert_close(rows[step], logits, atol=2e-4, rtol=1e-4)
    # it is not plain attention: after the window, full attention gives other logits
    full = StreamingReference(model, sink_tokens=0, window=10**9)  # type: ignore[arg-type]
    for token in tokens[:-1]:
        last = full.step(token)
    assert (last - rows[-1]).abs().max() > 1e-2


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_long_generation_matches_reference_in_bounded_kv(family: str) -> None:
    """30-token prompt (prefilled in chunks across the window), 80 tokens out: 110 tokens,
    past max_model_len (64), 28 blocks of KV, in a pool of 12."""
    prompt, out = 30, 80
    loop, captured, held, model, (req,) = _run(family, [(prompt, out)], num_gpu_blocks=12)
    _check_logits(loop, captured, model, req)
    bound = -(-SINKS // BS) + -(-(WINDOW + CHUNK) // BS) + 2  # StepLimits.peak_blocks
    assert max(held) <= bound < -(-(prompt + out) // BS)
    # in steady state: the sink block plus the window's blocks and the one being written
    assert held[-2] <= -(-SINKS // BS) + -(-WINDOW // BS) + 1


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preempted_streaming_requests_match(mode: str) -> None:
    """Two streaming requests in a pool too small for both: preemption swaps one out and back
    (its sink blocks return in front of the released positions) or recomputes it (its whole
    history prefilled again, sinks + window at a time); both still match."""
    loop, captured, _held, model, reqs = _run(
        "llama", [(9, 45), (13, 45)], num_gpu_blocks=11, num_cpu_blocks=16, mode=mode
    )
    planner = loop.scheduler.planner
    assert planner.num_preemptions_swap if mode == "swap" else planner.num_preemptions_recompute
    for req in reqs:
        _check_logits(loop, captured, model, req)
