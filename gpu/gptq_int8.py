"""GPTQ 8-bit packed tensors -> troupe's Int8Blocks (the form of a GGUF Q8_0 weight), or, where
int8 codes cannot hold them, their exact fp32 expansion (UnkeptInt8).

On disk (AutoGPTQ / gptqmodel / optimum; int32 words, four 8-bit codes a word, code i in bits
8i..8i+7, low byte first; K inputs, N outputs, G groups along K):

    qweight [K/4, N]   word (r, n) holds k = 4r + i          w[n, k] = (q - z[g, n]) s[g, n]
    qzeros  [G, N/4]   word (g, c) holds n = 4c + i          g = g_idx[k] with desc_act,
    scales  [G, N]     fp16                                       else k // group_size
    g_idx   [K]        int32                                 z = stored + 1 in v1 files

Kept (every zero 128, each input in group k // group_size: symmetric, no real act-order):
codes q - 128 as int8 [N, K] and the fp16 scale as fp32 per group of 32 (a group of 64 or
128, or a whole row, repeats its scale per 32, as gpu/gptq_awq_unpack.py does for int4), so
the native CPU kernel (gpu/cpu_q8.py), fbgemm's path and TP cuts take it as they take Q8_0.
(q - 128) s is exact in fp32 (8-bit code times an fp16 scale), so the expansion equals the
format's bit for bit.

Otherwise (asymmetric zeros: q - z spans -255..255; act-order: groups out of input order) the
linear is UnkeptInt8: the loader expands it (quantization "auto" / "dequantize"), and
quantization "keep" refuses it naming the field (gpu/gptq_awq_reader.py).
"""

from __future__ import annotations

import dataclasses

import torch
from troupe.gpu.gguf_quant import Int8Blocks
from troupe.gpu.gptq_awq_format import GROUP, PackedInt4Format
from troupe.gpu.gptq_awq_unpack import check_groups, gptq_parts, plain_groups

SYM_ZERO = 128  # GPTQ's symmetric 8-bit zero: (2^8 - 1 + 1) / 2


@dataclasses.dataclass(frozen=True)
class UnkeptInt8:
    """An 8-bit GPTQ linear int8 codes cannot hold: its parts, expanded on demand, and why."""

    codes: torch.Tensor  # uint8 [K, N], as shipped
    zeros: torch.Tensor  # int32 [G, N], the offset added
    scales: torch.Tensor  # fp16 [G, N]
    groups: torch.Tensor  # int64 [K]: each input's group
    reason: str  # the field and value that rule int8 out

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[1], self.codes.shape[0]

    def dequantize(self) -> torch.Tensor:
        """fp32 [N, K]: (q - z) s, exact in fp32 (a 9-bit integer times an fp16 scale)."""
        diff = self.codes.to(torch.int32) - self.zeros[self.groups]
        return (diff.float() * self.scales.float()[self.groups]).t().contiguous()


def gptq_int8(
    name: str,
    fmt: PackedInt4Format,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
) -> Int8Blocks | UnkeptInt8:
    """One 8-bit GPTQ linear (`name`: its prefix, for errors) converted (module docstring)."""
    codes, zeros, groups = gptq_parts(name, fmt, qweight, qzeros, scales, g_idx)
    k = codes.shape[0]
    check_groups(name, groups, scales.shape[0])
    plain = plain_groups(k, fmt.group_size)
    reason = _unkept_reason(name, fmt, zeros, bool(torch.equal(groups, plain)), k)
    if reason is not None:
        return UnkeptInt8(codes, zeros, scales, groups, reason)
    block_group = plain[::GROUP]  # [K/32]: each block of 32 inputs lies in one shipped group
    scale = scales.float()[block_group].t().contiguous()  # [N, K/32], fp16 values exactly
    signed = (codes.t().to(torch.int16) - SYM_ZERO).to(torch.int8).contiguous()  # [N, K]
    return Int8Blocks(signed, scale, GROUP)


def _unkept_reason(
    name: str, fmt: PackedInt4Format, zeros: torch.Tensor, in_order: bool, k: int
) -> str | None:
    """Why int8 codes cannot hold this linear (the field and value), None when they can."""
    if not fmt.sym:
        return "sym is False (8-bit zeros other than 128)"
    if not bool((zeros == SYM_ZERO).all()):
        return f"{name}.qzeros holds 8-bit zeros other than {SYM_ZERO} although sym is True"
    if not in_order:
        return f"desc_act is True and {name}.g_idx puts inputs out of group order"
    if k % GROUP:
        return f"{name}.qweight has {k} inputs, not a multiple of {GROUP}"
    return None
