"""How wide the input-embedding rows a runner takes are (EngineConfig.enable_prompt_embeds):
its model's hidden size, or 0 for a runner without a model of its own here (the fake runner,
tensor-parallel ranks, a disaggregated pair), which takes none. Torch-free, so the engine reads
it without loading torch for a fake runner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from troupe.gpu.runner_wrapper import RunnerWrapper

if TYPE_CHECKING:
    from troupe.gpu.model_config import ModelConfig
    from troupe.gpu.runner import Runner


@runtime_checkable
class HasModelConfig(Protocol):
    """A runner that runs its model in this process (gpu/model_runner.ModelRunner)."""

    model_config: ModelConfig


def prompt_embeds_width(runner: Runner) -> int:
    """The hidden size of the rows `runner` feeds its first layer (0: it takes none); a
    wrapper (fault injection, timing) answers for the runner it wraps."""
    while isinstance(runner, RunnerWrapper):
        runner = runner.inner
    if isinstance(runner, HasModelConfig):
        return runner.model_config.hidden_size
    return 0
