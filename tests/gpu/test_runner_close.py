"""ModelRunner.close frees the weights of a model the runner loaded, never a model its caller
built and may run again (an H200 bench reused one model for a bf16 and an fp8 runner and the
second found its embedding's storage freed)."""

from __future__ import annotations

import pytest
import torch
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.models import DecoderModel
from troupe.gpu.weights import build_model, qwen3_tiny_config, random_weights

OPTIONS = RunnerOptions(
    block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=2, max_model_len=64,
    enforce_eager=True,
)  # fmt: skip


def _model() -> DecoderModel:
    config = qwen3_tiny_config(vocab_size=256)
    weights = random_weights(config, torch.float32, seed=0)
    return build_model(config, weights.items(), torch.float32, torch.device("cpu"), 64)


def _sizes(model: DecoderModel) -> dict[str, int]:
    return {name: p.untyped_storage().nbytes() for name, p in model.named_parameters()}


def test_closing_leaves_a_caller_built_model_whole() -> None:
    model = _model()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    ModelRunner(model.config, model, OPTIONS).close()
    assert all(size > 0 for size in _sizes(model).values())
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    ModelRunner(model.config, model, OPTIONS).close()  # a second runner over it starts


@pytest.mark.parametrize("owns", [True, False])
def test_an_owned_model_is_freed_at_close(owns: bool) -> None:
    model = _model()
    ModelRunner(model.config, model, OPTIONS, owns_model=owns).close()
    freed = [name for name, size in _sizes(model).items() if size == 0]
    assert bool(freed) == owns
    if owns:
        assert freed == list(_sizes(model))  # every weight
