"""How wide the input-embedding rows a runner takes are (EngineConfig.enable_prompt_embeds):
its model's hidden size, or 0 for a runner without a model of its own here (the fake runner,
tensor-parallel ranks, a disaggregated pair), which takes none; and how many rows its vision
encoder makes of an image (0: it takes no images). Torch-free, so the engine reads them
without loading torch for a fake runner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from troupe.gpu.runner_wrapper import RunnerWrapper

if TYPE_CHECKING:
    from troupe.gpu.model_config import ModelConfig
    from troupe.gpu.models import DecoderModel
    from troupe.gpu.runner import Runner
    from troupe.gpu.vision_encoder import VisionEncoder


@runtime_checkable
class HasModelConfig(Protocol):
    """A runner that runs its model in this process (gpu/model_runner.ModelRunner)."""

    model_config: ModelConfig


@runtime_checkable
class HasModel(Protocol):
    """A runner whose model lives in this process (gpu/model_runner.ModelRunner)."""

    model: DecoderModel


def _unwrapped(runner: Runner) -> Runner:
    """The runner a wrapper (fault injection, timing) wraps: it answers for it."""
    while isinstance(runner, RunnerWrapper):
        runner = runner.inner
    return runner


def _vision(runner: Runner) -> VisionEncoder | None:
    inner = _unwrapped(runner)
    return inner.model.vision if isinstance(inner, HasModel) else None


def image_rows(runner: Runner) -> int:
    """The rows `runner`'s vision encoder makes of one image (0: it takes no images)."""
    vision = _vision(runner)
    return 0 if vision is None else vision.tokens_per_image


def whole_images(runner: Runner) -> bool:
    """Whether `runner`'s image rows attend to their whole image (each in one chunk)."""
    vision = _vision(runner)
    return vision is not None and vision.config.whole_image_attention


def prompt_embeds_width(runner: Runner) -> int:
    """The hidden size of the rows `runner` feeds its first layer (0: it takes none)."""
    inner = _unwrapped(runner)
    return inner.model_config.hidden_size if isinstance(inner, HasModelConfig) else 0
