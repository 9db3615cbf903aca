"""Every safetensors shard of a checkpoint kept open while a loader reads it piece by piece
(a linear's parts, a rank's slices may lie in different shards): tensor name -> its shard's
open handle. Used by the GPTQ / AWQ and compressed-tensors readers and the tensor-parallel
shard reader."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from troupe.gpu.model_config import ModelLoadError


def open_shards(files: list[Path], stack: contextlib.ExitStack) -> dict[str, Any]:
    """Each file opened on `stack` (closed with it); a ModelLoadError naming one that is not
    a readable safetensors file."""
    from safetensors import SafetensorError, safe_open

    where: dict[str, Any] = {}
    for file in files:
        try:
            handle = stack.enter_context(safe_open(str(file), framework="pt"))
        except SafetensorError as exc:
            raise ModelLoadError(f"{file}: not a readable safetensors file ({exc})") from exc
        where.update((name, handle) for name in handle.keys())
    return where
