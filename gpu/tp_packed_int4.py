"""GPTQ / AWQ and integer compressed-tensors folders under tensor parallelism: each rank
converts a packed linear whole (gpu/gptq_awq_unpack.py, gpu/ct_unpack.py) and keeps its slice,
as gpu/tp_quant.py keeps GGUF blocks. The folder's reader is the one gpu/weights.packed_reader
chooses (GPTQ / AWQ first) for one device.

    column-parallel  q/k/v, gate/up (lm_head): the rank's output rows; an act-order input
                     order (in_perm) is the whole input's, so it goes with every rank's rows
    row-parallel     o_proj, down_proj: the rank's input columns on a 32-column group edge;
                     an act-order weight cannot be cut by inputs (its groups of 32 mix
                     inputs of every rank): refused under quantization "keep", expanded
                     under "auto" (one log line)

Int8Blocks (8-bit GPTQ, gpu/gptq_int8.py; compressed-tensors W8A16 / W8A8) are cut the same
way (their groups of 32 along K); a linear the kept forms cannot hold (UnkeptInt8) is refused
under "keep" and expanded under "auto".

Every other tensor, and the dense reads, go through the folder's plain reader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from troupe.gpu.ct_reader import CtReader
from troupe.gpu.gguf_quant import Int8Blocks
from troupe.gpu.gptq_awq_format import GROUP
from troupe.gpu.gptq_awq_reader import Converted, PackedInt4Reader
from troupe.gpu.gptq_awq_unpack import PermutedInt4
from troupe.gpu.gptq_int8 import UnkeptInt8
from troupe.gpu.tp_quant import Kept, cannot_keep, on_block_edge

if TYPE_CHECKING:
    from troupe.gpu.tp_weights import ShardReader


class PackedInt4ShardReader:
    """A ShardReader (gpu/tp_weights.py) over a GPTQ / AWQ or integer compressed-tensors
    folder; see the module docstring."""

    def __init__(self, dense: ShardReader, packed: PackedInt4Reader | CtReader) -> None:
        self._dense, self._packed = dense, packed
        self._last: tuple[str, Converted] | None = None  # read after read_kept

    def has(self, name: str) -> bool:
        return self._packed.is_packed(name) or self._dense.has(name)

    def read(self, name: str, dim: int | None, start: int, stop: int) -> torch.Tensor:
        if not self._packed.is_packed(name):
            return self._dense.read(name, dim, start, stop)
        weight = self._convert(name).dequantize()
        if dim is None:
            return weight
        return weight[start:stop] if dim == 0 else weight[:, start:stop]

    def read_kept(
        self, name: str, dim: int | None, start: int, stop: int, strict: bool
    ) -> Kept | None:
        if not self._packed.is_packed(name):
            return self._dense.read_kept(name, dim, start, stop, strict)
        whole = self._convert(name)
        if isinstance(whole, UnkeptInt8):
            cannot_keep(f"tensor {name!r}: {self._packed.unkept_message(whole)}", strict)
            return None
        if dim is None:
            return whole
        if dim == 0:
            rows = torch.arange(start, stop)
            if isinstance(whole, PermutedInt4):
                return PermutedInt4(whole.blocks.rows(rows), whole.in_perm)
            return whole.rows(rows)
        if isinstance(whole, PermutedInt4):
            message = (
                f"quantization: tensor {name!r} is cut at columns [{start}, {stop}) for its "
                "tensor-parallel rank, but its GPTQ act-order (desc_act) groups mix the inputs "
                "of every rank"
            )
            cannot_keep(message, strict)
            return None
        form = "int8 group" if isinstance(whole, Int8Blocks) else "int4 group"
        if not on_block_edge(name, 1, start, stop, whole.shape[1], GROUP, form, strict):
            return None
        return whole.columns(start, stop)

    def _convert(self, name: str) -> Converted:
        if self._last is None or self._last[0] != name:
            self._last = (name, self._packed.convert(name.removesuffix(".weight")))
        return self._last[1]
