"""ModelRunner.launch/finish: a step sampled under grammar masks (tiny random model).

The constrained rows sample only allowed tokens, greedy or not; an unconstrained row in the
same step gets what execute() gives it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.weights import load_model
from troupe.messages import SamplingParams, SeqWork, StepPlan, StructuredOutputs, TokenMasks

SPEC = StructuredOutputs(regex="a")  # only marks the request as constrained here


def _runner(folder: Path, device: str) -> ModelRunner:
    config, model = load_model(folder, torch.float32, torch.device(device), 64)
    options = RunnerOptions(block_size=4, num_gpu_blocks=32, max_model_len=64)
    return ModelRunner(config, model, options)


def _plan(params: list[SamplingParams], awaits: bool) -> StepPlan:
    seqs = tuple(
        SeqWork(
            request_id=f"r{i}",
            token_ids=(5 + i, 9, 11),
            start_pos=0,
            block_ids=(i,),
            reset=True,
            params=p,
        )
        for i, p in enumerate(params)
    )
    return StepPlan(step_id=1, seqs=seqs, awaits_masks=awaits)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_masked_step_samples_only_allowed_tokens(hf_folder, device: str) -> None:  # type: ignore[no-untyped-def]
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA")
    folder, _ = hf_folder("qwen3")
    params = [
        SamplingParams(temperature=0.0, structured_outputs=SPEC),
        SamplingParams(temperature=1.0, seed=4, structured_outputs=SPEC),
        SamplingParams(temperature=0.0),
    ]
    allowed = (3, 17, 200)
    words = (256 + 31) // 32
    bits = np.zeros((2, words), dtype=np.int32)
    for t in allowed:
        bits[:, t // 32] |= np.int32(1 << (t % 32)) if t % 32 < 31 else np.int32(-(2**31))
    masks = TokenMasks(step_id=1, request_ids=("r0", "r1"), num_words=words, bitmask=bits.tobytes())
    runner = _runner(folder, device)
    runner.launch(_plan(params, awaits=True))
    sampled = runner.finish(masks)
    free = _runner(folder, device).execute(_plan(params, awaits=False))
    assert [s.request_id for s in sampled] == ["r0", "r1", "r2"]
    assert sampled[0].token_id in allowed and sampled[1].token_id in allowed
    assert sampled[2].token_id == free[2].token_id
