"""A pipeline stage's weights from an HF folder or a GGUF file: only its own layers' tensors
(renumbered from 0), embed_tokens where it embeds or reads the tied head, the final norm and
lm_head on the last stage. The parameters a stage does not hold are empty (gpu/pp_model.py):
they are filled with empty tensors so fill_weights' "every parameter filled" check still holds.
GGUF, GPTQ / AWQ and integer compressed-tensors linears are dequantized (quantized stages:
not built); safetensors tensors of other stages are never read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from troupe.gpu.fp8_weights import expand_fp8, read_fp8_weights
from troupe.gpu.gguf_weights import forget_gguf_directories, iter_gguf_tensors
from troupe.gpu.model_config import ModelConfig, ModelLoadError
from troupe.gpu.pp_model import PPStageModel
from troupe.gpu.weight_fill import fill_weights
from troupe.gpu.weights import packed_reader, safetensors_files

# what a stage that does not hold these parameters keeps empty (PPStageModel)
_EDGE_NAMES = {
    "model.embed_tokens.weight": "embed_tokens",
    "model.norm.weight": "norm",
    "model.norm.bias": "norm_bias",  # a LayerNorm's (StarCoder2)
    "lm_head.weight": "lm_head",
}


def load_stage(model: PPStageModel, path: Path, full: ModelConfig) -> None:
    """Fill `model` (one stage) from the checkpoint at `path`."""
    if path.suffix == ".gguf":
        try:
            _fill(model, iter_gguf_tensors(path, full), str(path))
        finally:
            forget_gguf_directories()
        return
    packed = packed_reader(path)
    if packed is not None:  # GPTQ / AWQ / compressed-tensors int: this stage's linears expanded
        with packed as reader:
            wanted = reader.dense(set(), lambda name: _wanted(model, name) is not None)
            _fill(model, wanted, str(path))
        return
    files = safetensors_files(path)
    fp8 = read_fp8_weights(files)
    tensors = _read_safetensors(files, model)
    _fill(model, expand_fp8(tensors, fp8, set()) if fp8 else tensors, str(path))


def _fill(model: PPStageModel, tensors: Iterable[tuple[str, torch.Tensor]], source: str) -> None:
    fill_weights(model, _stage_tensors(model, tensors), source)


def _wanted(model: PPStageModel, name: str) -> str | None:
    """The name this stage fills from HF tensor `name`, None when it is another stage's."""
    edge = _EDGE_NAMES.get(name)
    if edge is not None:
        held = getattr(model, edge)  # None: a model without it (tied head, RMSNorm)
        return name if held is not None and held.numel() else None
    return model.stage.local_layer(name)


def _stage_tensors(
    model: PPStageModel, tensors: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in tensors:
        local = _wanted(model, name)
        if local is not None:
            yield local, tensor
    for name, attr in _EDGE_NAMES.items():  # the parameters this stage holds empty
        held = getattr(model, attr)
        if held is not None and held.numel() == 0:
            yield name, torch.empty(held.shape, dtype=held.dtype)


def _read_safetensors(files: list[Path], model: PPStageModel) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the tensors this stage holds: the others are never read from disk
    (fp8 weights are expanded from read_fp8_weights' copies, their scales not needed here)."""
    from safetensors import SafetensorError, safe_open

    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    if _wanted(model, name) is not None:
                        yield name, handle.get_tensor(name)
        except SafetensorError as exc:
            raise ModelLoadError(f"{file}: not a readable safetensors file ({exc})") from exc
