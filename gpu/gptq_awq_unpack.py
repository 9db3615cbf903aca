"""GPTQ and AWQ packed 4-bit tensors -> troupe's Int4Blocks (per-32 scale and bias), the codes
kept as shipped, so every int4 path (CPU kernels, CUDA columns, fusing, TP cuts) runs them.

On disk (int32 words, eight 4-bit codes a word, code i in bits 4i..4i+3; K inputs, N outputs,
G groups along K):

    GPTQ  qweight [K/8, N]   word (r, n) holds k = 8r + i           w[n, k] = (q - z[g, n]) s[g, n]
          qzeros  [G, N/8]   word (g, c) holds n = 8c + i           g = g_idx[k] with desc_act,
          scales  [G, N]     fp16                                        else k // group_size
          g_idx   [K]        int32                                  z = stored + 1 in v1 files
    AWQ   qweight [K, N/8]   word (k, c) holds n = 8c + AWQ_ORDER[i]
          qzeros  [G, N/8]   the same order                         g = k // group_size
          scales  [G, N]

Converted: codes [N, K] packed in Q4_0 nibble order, scale = s and bias = -z s per group of 32
(a shipped group of 64 or 128, or a whole row, repeats its pair per 32). Both products are
exact in fp32 (an fp16 scale times a code or zero of at most 5 bits), so the expansion
q s + bias equals (q - z) s bit for bit; kernels that keep fp16 factors round only the bias.

Act-order (desc_act): g_idx puts inputs of one group anywhere along K. The columns are
reordered so each group's inputs are contiguous (`in_perm`: a stable sort of g_idx); the layer
gathers its input in the same order (gpu/quant_linear.Int4Linear), once per call.
"""

from __future__ import annotations

import dataclasses

import torch
from troupe.gpu.fp8_weights import Fp8Weight
from troupe.gpu.gguf_quant import Int4Blocks, QuantBlocks, pack_nibbles
from troupe.gpu.gptq_awq_format import GROUP, PackedInt4Format
from troupe.gpu.model_config import ModelLoadError

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # code i of a word -> its column within the word's 8
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


@dataclasses.dataclass(frozen=True)
class PermutedInt4:
    """Int4Blocks whose column j multiplies input in_perm[j] (GPTQ act-order)."""

    blocks: Int4Blocks
    in_perm: torch.Tensor  # int64 [K]

    @property
    def shape(self) -> tuple[int, int]:
        return self.blocks.shape

    def dequantize(self) -> torch.Tensor:
        """fp32 [N, K] in the input's own order."""
        permuted = self.blocks.dequantize()
        out = torch.empty_like(permuted)
        out[:, self.in_perm] = permuted
        return out


def unpack_words(words: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """int32 [..., M] -> uint8 codes [..., M, 32 / bits], code i = bits b i .. b i + b - 1 of
    its word, lowest first (GPTQ, AWQ and compressed-tensors all pack so)."""
    shifts = _SHIFTS if bits == 4 else torch.arange(0, 32, bits, dtype=torch.int32)
    codes: torch.Tensor = (words[..., None] >> shifts) & (2**bits - 1)
    return codes.to(torch.uint8)


def gptq_blocks(
    name: str,
    fmt: PackedInt4Format,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
) -> Int4Blocks | PermutedInt4:
    """One GPTQ linear (`name`: its prefix, for errors) converted (module docstring)."""
    codes, zeros, groups = gptq_parts(name, fmt, qweight, qzeros, scales, g_idx)
    return _to_blocks(name, codes, zeros, scales, groups)


def gptq_parts(
    name: str,
    fmt: PackedInt4Format,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GPTQ linear of fmt.bits (4 or 8) unpacked: codes [K, N], zeros [G, N] (v1's offset
    added) and each input's group [K]; ModelLoadError naming a part that does not fit."""
    k, n = qweight.shape[0] * (32 // fmt.bits), qweight.shape[1]
    codes = unpack_words(qweight, fmt.bits).permute(0, 2, 1).reshape(k, n)  # [K, N]
    zeros = _zeros(name, qzeros, scales, n, fmt.bits) + fmt.zero_offset
    if fmt.desc_act and fmt.group_size != -1:
        if g_idx is None:
            raise ModelLoadError(f"{name}.g_idx: missing; desc_act needs each input's group")
        if tuple(g_idx.shape) != (k,):
            raise ModelLoadError(f"{name}.g_idx: shape {tuple(g_idx.shape)}, expected ({k},)")
        return codes, zeros, g_idx.long()
    # vLLM and the exllama kernels ignore g_idx without desc_act: so does troupe
    return codes, zeros, plain_groups(k, fmt.group_size)


def plain_groups(k: int, group_size: int) -> torch.Tensor:
    """Each of `k` inputs' group in input order (group_size -1: one group, per channel)."""
    return torch.arange(k) // (group_size if group_size != -1 else k)


def check_groups(name: str, groups: torch.Tensor, num_groups: int) -> None:
    """ModelLoadError where an input's group is not one of the `num_groups` shipped."""
    if int(groups.min()) < 0 or int(groups.max()) >= num_groups:
        raise ModelLoadError(f"{name}: a group index is outside the {num_groups} groups shipped")


def awq_blocks(
    name: str,
    fmt: PackedInt4Format,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
) -> Int4Blocks:
    """One AWQ (GEMM layout) linear converted (module docstring)."""
    k, n = qweight.shape[0], qweight.shape[1] * 8
    codes = _awq_columns(unpack_words(qweight))  # [K, N]
    zeros = _awq_columns(unpack_words(qzeros)).to(torch.int32)
    if tuple(scales.shape) != tuple(zeros.shape) or scales.shape[1] != n:
        raise ModelLoadError(
            f"{name}.scales: shape {tuple(scales.shape)}, expected {tuple(zeros.shape)} "
            f"(qzeros unpacked; {n} outputs)"
        )
    blocks = _to_blocks(name, codes, zeros, scales, torch.arange(k) // fmt.group_size)
    assert isinstance(blocks, Int4Blocks)  # contiguous groups: no reordering
    return blocks


def _awq_columns(codes: torch.Tensor) -> torch.Tensor:
    """[R, M, 8] codes in AWQ's order within each word -> [R, 8M] in column order."""
    out = torch.empty_like(codes)
    out[..., list(AWQ_ORDER)] = codes
    return out.reshape(codes.shape[0], -1)


def _zeros(
    name: str, qzeros: torch.Tensor, scales: torch.Tensor, n: int, bits: int
) -> torch.Tensor:
    """GPTQ's stored zeros [G, N] as int32 (no offset)."""
    zeros = unpack_words(qzeros, bits).reshape(qzeros.shape[0], -1)[:, :n].to(torch.int32)
    if scales.dim() != 2 or scales.shape[1] != n or zeros.shape != (scales.shape[0], n):
        raise ModelLoadError(
            f"{name}: scales {tuple(scales.shape)} and qzeros {tuple(qzeros.shape)} do not "
            f"match qweight's {n} outputs"
        )
    return zeros


def _to_blocks(
    name: str, codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, groups: torch.Tensor
) -> Int4Blocks | PermutedInt4:
    """codes [K, N], zeros and scales [G, N], groups [K] (each input's group) -> blocks of 32
    along K, reordered so that each block lies in one group."""
    k, num_groups = codes.shape[0], scales.shape[0]
    if k % GROUP:
        raise ModelLoadError(f"{name}.qweight: {k} inputs, not a multiple of {GROUP}")
    check_groups(name, groups, num_groups)
    perm = torch.argsort(groups, stable=True)
    is_identity = bool(torch.equal(perm, torch.arange(k)))
    sorted_groups = groups[perm].view(-1, GROUP)
    if not bool((sorted_groups == sorted_groups[:, :1]).all()):
        raise ModelLoadError(
            f"{name}.g_idx: a group does not hold a multiple of {GROUP} inputs; troupe's int4 "
            f"layout takes groups of {GROUP}"
        )
    block_group = sorted_groups[:, 0]  # [K/32]
    scale = scales.float()[block_group].t().contiguous()  # [N, K/32]
    bias = -(zeros.float()[block_group].t() * scale)  # exact in fp32 (module docstring)
    ordered = codes if is_identity else codes[perm]
    blocks = Int4Blocks(pack_nibbles(ordered.t().contiguous()), scale, bias.contiguous(), GROUP)
    return blocks if is_identity else PermutedInt4(blocks, perm)


def shared_input_order(
    parts: list[QuantBlocks | Fp8Weight | PermutedInt4], names: list[str]
) -> tuple[list[QuantBlocks | Fp8Weight], torch.Tensor | None]:
    """Parts of one fused projection (one input) with their shared input order taken off;
    ModelLoadError naming the tensors when their orders differ."""
    perms = [p.in_perm if isinstance(p, PermutedInt4) else None for p in parts]
    first = perms[0]
    for name, perm in zip(names[1:], perms[1:], strict=True):
        same = perm is None if first is None else perm is not None and torch.equal(perm, first)
        if not same:
            raise ModelLoadError(
                f"tensors {names[0]!r} and {name!r} share an input but their GPTQ g_idx orders "
                "differ; the fused projection needs one input order"
            )
    return [p.blocks if isinstance(p, PermutedInt4) else p for p in parts], first
