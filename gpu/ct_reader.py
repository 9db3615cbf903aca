"""The tensors of an integer compressed-tensors folder (gpu/ct_format.py) in the two streams
gpu/weights.load_model feeds, as gpu/gptq_awq_reader.PackedInt4Reader does for GPTQ / AWQ:
`modules()` the quantized linears converted (gpu/ct_unpack.py) under HF weight names, for
gpu/quant_install.install_quantized; `dense(kept)` everything else, each quantized linear not in
`kept` expanded to fp32, the activation scales of W8A8 folders dropped (weight-only). A linear
Int4Blocks / Int8Blocks cannot hold is left out of `modules()` (so it is expanded); with
`strict` (quantization "keep" asked for) it is refused instead, naming the field. Tensor-
parallel ranks cut `convert`'s forms (gpu/tp_packed_int4.py); pipeline stages read
`dense(set(), wanted)`, their own layers expanded (gpu/pp_weights.py).

A quantized linear is a prefix with `weight_packed` (pack-quantized) or an int8 `weight`
(int-quantized) whose module a config group targets; its parts may lie in different shards:
every shard stays open and each part is read when its linear is converted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from troupe.gpu.ct_format import CtFormat, CtWeights
from troupe.gpu.ct_unpack import Converted, convert_linear
from troupe.gpu.gguf_quant import QuantBlocks
from troupe.gpu.gptq_awq_reader import kept_forms
from troupe.gpu.gptq_int8 import UnkeptInt8
from troupe.gpu.model_config import ModelLoadError
from troupe.gpu.safetensors_shards import open_shards

_PARTS = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx")
_ACTIVATIONS = (".input_scale", ".input_zero_point", ".output_scale", ".output_zero_point")


class CtReader:
    """Open shards of one compressed-tensors folder (a context manager); module docstring."""

    def __init__(self, files: list[Path], fmt: CtFormat, strict: bool = False) -> None:
        self.fmt = fmt
        self.strict = strict  # refuse a linear the kept forms cannot hold, not expand it
        self._stack = contextlib.ExitStack()
        self._where: dict[str, Any] = {}  # tensor name -> its shard's open handle
        self._linears: dict[str, CtWeights] = {}  # quantized linear prefix -> its settings
        self._files = files

    def __enter__(self) -> CtReader:
        self._where = open_shards(self._files, self._stack)
        for name, handle in self._where.items():
            is_int8 = name.endswith(".weight") and handle.get_slice(name).get_dtype() == "I8"
            if name.endswith(".weight_packed") or is_int8:
                prefix = name.rsplit(".", 1)[0]
                self._linears[prefix] = self._settings(prefix, name)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _settings(self, prefix: str, name: str) -> CtWeights:
        weights = self.fmt.weights_for(prefix)
        if weights is None:
            raise ModelLoadError(
                f"{name}: quantized, but no config_groups target {prefix!r} (or ignore lists "
                f"it) in {self.fmt.source}"
            )
        if not name.endswith("." + _codes_part(weights)):
            raise ModelLoadError(
                f"{name}: found where the config group for {prefix!r} has format {weights.format!r}"
            )
        return weights

    def is_packed(self, weight: str) -> bool:
        """Whether HF weight name `weight` (`<prefix>.weight`) is a quantized linear here."""
        return weight.endswith(".weight") and weight[: -len(".weight")] in self._linears

    def prefixes(self) -> list[str]:
        """Every quantized linear's name prefix, in file order."""
        return list(self._linears)

    def modules(self) -> Iterator[tuple[str, QuantBlocks]]:
        """(`<prefix>.weight`, converted) for every quantized linear it can keep, one at a time."""
        return kept_forms(self.prefixes(), self.convert, self.unkept_message, self.strict)

    def unkept_message(self, weight: UnkeptInt8) -> str:
        """quantization "keep"'s refusal of a linear the kept forms cannot hold."""
        return (
            f"quantization 'keep': {weight.reason}; troupe keeps compressed-tensors integer "
            "weights as int4 / int8 only with group or channel strategy, groups of a multiple "
            "of 32 in input order, and 8-bit ones symmetric (quantization 'auto' or "
            "'dequantize' expands them)"
        )

    def dense(
        self, kept: set[str], wanted: Callable[[str], bool] | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Every other tensor as shipped; quantized linears not in `kept` (HF weight names)
        expanded to fp32 [N, K]. `wanted`: which HF names to read at all (a pipeline stage's
        own), default every one."""
        for name, handle in self._where.items():
            prefix, _, suffix = name.rpartition(".")
            if prefix in self._linears:
                weight = prefix + ".weight"
                first = _codes_part(self._linears[prefix])
                if suffix == first and weight not in kept and (wanted is None or wanted(weight)):
                    yield weight, self.convert(prefix).dequantize()
            elif not name.endswith(_ACTIVATIONS) and (wanted is None or wanted(name)):
                yield name, handle.get_tensor(name)

    def convert(self, prefix: str) -> Converted:
        """The linear at `prefix` in troupe's kept form, or UnkeptInt8 (gpu/ct_unpack.py)."""
        weights = self._linears[prefix]
        parts = {}
        for part in (_codes_part(weights), *_PARTS[1:]):
            handle = self._where.get(f"{prefix}.{part}")
            if handle is not None:
                parts[part] = handle.get_tensor(f"{prefix}.{part}")
        if "weight_scale" not in parts:
            raise ModelLoadError(f"{prefix}.weight_scale: missing; a quantized linear needs it")
        return convert_linear(prefix, weights, parts)


def _codes_part(weights: CtWeights) -> str:
    """The tensor a linear's codes are in: `weight_packed` (pack-quantized) or `weight`."""
    return "weight_packed" if weights.format == "pack-quantized" else "weight"
