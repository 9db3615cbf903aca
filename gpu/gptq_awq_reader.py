"""The tensors of a GPTQ / AWQ folder in the two streams gpu/weights.load_model feeds:
`modules()` the packed linears converted to Int4Blocks (or PermutedInt4; 8-bit GPTQ: Int8Blocks)
under HF weight names, for gpu/quant_install.install_quantized; `dense(kept)` everything else,
with each packed linear not in `kept` expanded to fp32 (the "dequantize" path, and parts the
installer left dense). An 8-bit linear int8 codes cannot hold (gpu/gptq_int8.UnkeptInt8:
asymmetric, act-order) is left out of `modules()`, so it is expanded; with `strict`
(quantization "keep" asked for) it is refused instead, naming the field.

A linear's tensors (`<prefix>.qweight`, `.qzeros`, `.scales`, GPTQ's `.g_idx`) may lie in
different shards of a sharded folder: every shard stays open and each tensor is read when its
linear is converted, one linear at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from troupe.gpu.gguf_quant import Int4Blocks, Int8Blocks, QuantBlocks
from troupe.gpu.gptq_awq_format import PackedInt4Format
from troupe.gpu.gptq_awq_unpack import PermutedInt4, awq_blocks, gptq_blocks
from troupe.gpu.gptq_int8 import UnkeptInt8, gptq_int8
from troupe.gpu.model_config import ModelLoadError
from troupe.gpu.safetensors_shards import open_shards

Kept = TypeVar("Kept")
_PARTS = (".qweight", ".qzeros", ".scales", ".g_idx")
Converted = Int4Blocks | PermutedInt4 | Int8Blocks | UnkeptInt8


class PackedInt4Reader:
    """Open shards of one GPTQ / AWQ folder (a context manager); see the module docstring."""

    def __init__(self, files: list[Path], fmt: PackedInt4Format, strict: bool = False) -> None:
        self.fmt = fmt
        self.strict = strict  # refuse an 8-bit linear int8 cannot hold, not expand it
        self._stack = contextlib.ExitStack()
        self._where: dict[str, Any] = {}  # tensor name -> its shard's open handle
        self._files = files

    def __enter__(self) -> PackedInt4Reader:
        self._where = open_shards(self._files, self._stack)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def is_packed(self, weight: str) -> bool:
        """Whether HF weight name `weight` (`<prefix>.weight`) is a packed linear here."""
        return weight.removesuffix(".weight") + ".qweight" in self._where

    def prefixes(self) -> list[str]:
        """Every packed linear's name prefix, in file order."""
        return [n[: -len(".qweight")] for n in self._where if n.endswith(".qweight")]

    def modules(self) -> Iterator[tuple[str, QuantBlocks | PermutedInt4]]:
        """(`<prefix>.weight`, converted) for every packed linear it can keep, one at a time."""
        return kept_forms(self.prefixes(), self.convert, self.unkept_message, self.strict)

    def unkept_message(self, weight: UnkeptInt8) -> str:
        """quantization "keep"'s refusal of an 8-bit linear int8 codes cannot hold."""
        return (
            f"quantization 'keep': {weight.reason}; troupe keeps 8-bit GPTQ weights as int8 "
            "only when symmetric (every zero 128) with groups in input order (quantization "
            "'auto' or 'dequantize' expands them)"
        )

    def dense(
        self, kept: set[str], wanted: Callable[[str], bool] | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Every other tensor as shipped; packed linears not in `kept` (HF weight names)
        expanded to fp32 [N, K] in the input's order. `wanted`: which HF names to read at all
        (a pipeline stage's own), default every one."""
        for name, handle in self._where.items():
            if name.endswith(".qweight"):
                weight = name[: -len(".qweight")] + ".weight"
                if weight not in kept and (wanted is None or wanted(weight)):
                    yield weight, self.convert(weight[: -len(".weight")]).dequantize()
            elif not name.endswith(_PARTS) and (wanted is None or wanted(name)):
                yield name, handle.get_tensor(name)

    def convert(self, prefix: str) -> Converted:
        """The linear at `prefix` in troupe's int4 form (gpu/gptq_awq_unpack.py), or for 8-bit
        GPTQ its int8 form (gpu/gptq_int8.py)."""
        qweight, qzeros, scales = (self._get(prefix + p) for p in _PARTS[:3])
        if self.fmt.method == "awq":
            return awq_blocks(prefix, self.fmt, qweight, qzeros, scales)
        g_idx = self._where.get(prefix + ".g_idx")
        groups = None if g_idx is None else g_idx.get_tensor(prefix + ".g_idx")
        if self.fmt.bits == 8:
            return gptq_int8(prefix, self.fmt, qweight, qzeros, scales, groups)
        return gptq_blocks(prefix, self.fmt, qweight, qzeros, scales, groups)

    def _get(self, name: str) -> torch.Tensor:
        handle = self._where.get(name)
        if handle is None:
            raise ModelLoadError(f"{name}: missing; a {self.fmt.method.upper()} linear needs it")
        tensor: torch.Tensor = handle.get_tensor(name)
        if name.endswith((".qweight", ".qzeros")) and tensor.dtype != torch.int32:
            raise ModelLoadError(f"{name}: dtype {tensor.dtype}, expected int32 words")
        if tensor.dim() != 2:
            raise ModelLoadError(f"{name}: shape {tuple(tensor.shape)}, expected 2-D")
        return tensor


def kept_forms(
    prefixes: Iterable[str],
    convert: Callable[[str], Kept | UnkeptInt8],
    refusal: Callable[[UnkeptInt8], str],
    strict: bool,
) -> Iterator[tuple[str, Kept]]:
    """(`<prefix>.weight`, converted) for each linear a kept form holds, one at a time; one
    that none holds (UnkeptInt8) is left for `dense()` to expand, or refused with `strict`
    (quantization "keep"), `refusal` naming why. Shared by the GPTQ / AWQ and the
    compressed-tensors readers."""
    for prefix in prefixes:
        converted = convert(prefix)
        if isinstance(converted, UnkeptInt8):
            if strict:
                raise ModelLoadError(refusal(converted))
            continue  # dense() expands it
        yield prefix + ".weight", converted
