"""Loading the draft model (speculative_method="draft_model"): any smaller model of the
target's vocabulary, an HF folder or a GGUF file, loaded like the target (same dtype, device,
kernels and quantization setting). Refused, with both sizes named, when it cannot draft for
the target."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from troupe.config import ConfigError, EngineConfig
from troupe.gpu.cpu_q4lib import Q4Options
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderModel
from troupe.gpu.pool_sizing import block_bytes
from troupe.gpu.weights import load_model, read_config


@dataclasses.dataclass(frozen=True)
class DraftModel:
    """A loaded draft model: the runner gives it its own KV pool (gpu/draft_runner.py)."""

    config: ModelConfig
    model: DecoderModel

    def block_bytes(self, block_size: int, dtype: torch.dtype) -> int:
        """Bytes of one block of its pool: each target block id has one here too."""
        return block_bytes(self.config, block_size, dtype)


def check_draft(target: ModelConfig, draft: ModelConfig) -> None:
    """ConfigError when `draft` cannot propose tokens for `target`."""
    if draft.vocab_size != target.vocab_size:
        raise ConfigError(
            f"draft_model has a vocabulary of {draft.vocab_size} tokens, the model has "
            f"{target.vocab_size}: a draft model must share the model's vocabulary"
        )
    if target.kv_window and not 0 < draft.kv_window <= target.kv_window:
        # the scheduler releases blocks behind the target's window: the draft must not read them
        window = draft.kv_window or "all"
        raise ConfigError(
            f"draft_model attends to {window} tokens back, the model to {target.kv_window}: "
            "a draft model of a sliding-window model needs a window no wider"
        )


def load_draft(
    config: EngineConfig,
    target: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
) -> DraftModel:
    """Read and check config.draft_model, then load it."""
    assert config.draft_model is not None, "EngineConfig checks draft_model is set"
    path = Path(config.draft_model).expanduser()
    if not path.exists():
        raise ConfigError(f"draft_model path {str(path)!r} does not exist")
    check_draft(target, read_config(path))
    draft_config, model = load_model(
        path,
        dtype,
        device,
        max_model_len,
        config.kernel_backend,
        config.quantization,
        Q4Options.from_config(config),
    )
    return DraftModel(draft_config, model)
