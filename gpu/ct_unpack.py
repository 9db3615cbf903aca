"""One compressed-tensors integer linear -> troupe's Int4Blocks (4-bit) or Int8Blocks (8-bit),
the codes kept as shipped, or where those forms cannot hold it, its exact fp32 expansion
(gpu/gptq_int8.UnkeptInt8: codes, zeros, scales and each input's group).

On disk (N outputs, K inputs, G groups along K, b bits, offset o = 2^(b-1)):

    pack-quantized  weight_packed      int32 [N, ceil(K/p)], p = 32/b codes a word: word
                                       (n, j) holds k = p*j + i in bits b*i.., stored q + o
                    weight_shape       int [2]: N, K (the words pad K up to p)
                    weight_scale       [N, G] (group), [N, 1] (channel), [1] (tensor)
                    weight_zero_point  asymmetric group / channel: int32 [ceil(N/p), G], word
                                       (r, g) holds n = p*r + i, stored z + o; tensor: [1]
                                       as is (signed)
                    weight_g_idx       int [K]: each input's group (actorder), optional
    int-quantized   weight             int8 [N, K] signed q; weight_zero_point (asymmetric)
                                       int8 [N, G] as is; scale and g_idx as above

    w[n, k] = (q - z) s[n, g], g = g_idx[k] if shipped, else k // group_size (channel,
    tensor: 0); symmetric: z = 0.

Both sides are taken unsigned (u = q + o, zu = z + o), so w = (u - zu) s. Kept 4-bit: u as
the codes, scale s and bias -zu s per group of 32 (a group of 64 or 128, or a whole row,
repeats its pair per 32): q s and zu s are exact in fp32 for a bf16 / fp16 scale, so the
expansion equals the format bit for bit, as for GPTQ (gpu/gptq_awq_unpack.py). Kept 8-bit
(symmetric only): int8 codes u - 128 = q and s per 32, as gpu/gptq_int8.py keeps GPTQ.
Otherwise (8-bit asymmetric, groups out of input order, tensor strategy, K or the group size
not a multiple of 32) the linear is UnkeptInt8 with the field and value that rule it out.
"""

from __future__ import annotations

import torch
from troupe.gpu.ct_format import CtWeights
from troupe.gpu.gguf_quant import Int4Blocks, Int8Blocks, pack_nibbles
from troupe.gpu.gptq_awq_format import GROUP
from troupe.gpu.gptq_awq_unpack import plain_groups, unpack_words
from troupe.gpu.gptq_int8 import UnkeptInt8
from troupe.gpu.model_config import ModelLoadError

Converted = Int4Blocks | Int8Blocks | UnkeptInt8
_SCALE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def unpack_int32(words: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [R, M] -> int32 codes [R, M * 32/bits]: code i of word j at column (32/bits) j + i."""
    return unpack_words(words, bits).reshape(words.shape[0], -1).to(torch.int32)


def convert_linear(name: str, w: CtWeights, parts: dict[str, torch.Tensor]) -> Converted:
    """The linear at prefix `name` from its tensors by suffix ("weight_packed" or "weight",
    "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx"); module docstring."""
    codes = _codes(name, w, parts)  # unsigned [N, K]
    n, k = codes.shape
    scale = parts["weight_scale"]
    if scale.dtype not in _SCALE_DTYPES:
        raise ModelLoadError(f"{name}.weight_scale: dtype {scale.dtype}, expected bf16/fp16/fp32")
    num_groups = -(-k // w.group_size) if w.strategy == "group" else 1
    if w.strategy == "tensor" and scale.numel() == 1:
        scale = scale.reshape(1, 1).expand(n, 1)
    if tuple(scale.shape) != (n, num_groups):
        raise ModelLoadError(
            f"{name}.weight_scale: shape {tuple(scale.shape)}, expected {(n, num_groups)} "
            f"(strategy {w.strategy!r})"
        )
    zeros = _zeros(name, w, parts.get("weight_zero_point"), n, num_groups)  # unsigned [N, G]
    plain = plain_groups(k, w.group_size if w.strategy == "group" else -1)  # channel: one
    groups = plain
    g_idx = parts.get("weight_g_idx")
    if g_idx is not None:
        if tuple(g_idx.shape) != (k,):
            raise ModelLoadError(
                f"{name}.weight_g_idx: shape {tuple(g_idx.shape)}, expected ({k},)"
            )
        groups = g_idx.long()
        if int(groups.min()) < 0 or int(groups.max()) >= num_groups:
            raise ModelLoadError(f"{name}.weight_g_idx: a group outside the {num_groups} shipped")
    reason = _unkept_reason(name, w, k, bool(torch.equal(groups, plain)))
    if reason is not None:
        return UnkeptInt8(
            codes.t().to(torch.uint8), zeros.t().contiguous(), scale.t(), groups, reason
        )
    block_scale = scale.float()[:, plain[::GROUP]].contiguous()  # [N, K/32]
    if w.num_bits == 8:
        return Int8Blocks((codes - 128).to(torch.int8).contiguous(), block_scale, GROUP)
    bias = -(zeros[:, plain[::GROUP]].float() * block_scale)  # exact in fp32 (docstring)
    return Int4Blocks(pack_nibbles(codes.to(torch.uint8)), block_scale, bias.contiguous(), GROUP)


def _codes(name: str, w: CtWeights, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """Unsigned codes u = q + o, int32 [N, K]."""
    if w.format == "int-quantized":
        weight = parts["weight"]
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise ModelLoadError(
                f"{name}.weight: {weight.dtype} {tuple(weight.shape)}, expected int8 [N, K]"
            )
        return weight.to(torch.int32) + 128
    packed, shape = parts["weight_packed"], parts.get("weight_shape")
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ModelLoadError(f"{name}.weight_packed: {packed.dtype}, expected int32 [N, K/p]")
    per = 32 // w.num_bits
    if shape is None or shape.numel() != 2:
        raise ModelLoadError(f"{name}.weight_shape: missing or not [N, K]")
    n, k = (int(v) for v in shape.flatten())
    if tuple(packed.shape) != (n, -(-k // per)):
        raise ModelLoadError(
            f"{name}.weight_packed: shape {tuple(packed.shape)}, expected {(n, -(-k // per))} "
            f"for weight_shape {(n, k)} at {w.num_bits} bits"
        )
    return unpack_int32(packed, w.num_bits)[:, :k]


def _zeros(
    name: str, w: CtWeights, stored: torch.Tensor | None, n: int, num_groups: int
) -> torch.Tensor:
    """Unsigned zeros zu = z + o, int32 [N, G]."""
    offset = 2 ** (w.num_bits - 1)
    if w.symmetric:
        return torch.full((n, num_groups), offset, dtype=torch.int32)
    if stored is None:
        raise ModelLoadError(f"{name}.weight_zero_point: missing; symmetric is false")
    if w.format == "pack-quantized" and w.strategy != "tensor":  # packed along N
        per = 32 // w.num_bits
        if stored.dtype != torch.int32 or tuple(stored.shape) != (-(-n // per), num_groups):
            raise ModelLoadError(
                f"{name}.weight_zero_point: {stored.dtype} {tuple(stored.shape)}, expected "
                f"int32 {(-(-n // per), num_groups)} (packed along the outputs)"
            )
        return unpack_int32(stored.t().contiguous(), w.num_bits)[:, :n].t().contiguous()
    if stored.numel() == 1:
        stored = stored.reshape(1, 1).expand(n, num_groups)
    if tuple(stored.shape) != (n, num_groups):
        raise ModelLoadError(
            f"{name}.weight_zero_point: shape {tuple(stored.shape)}, expected {(n, num_groups)}"
        )
    unsigned: torch.Tensor = stored.to(torch.int32) + offset
    return unsigned


def _unkept_reason(name: str, w: CtWeights, k: int, in_order: bool) -> str | None:
    """Why Int4Blocks / Int8Blocks cannot hold this linear (the field and value), or None."""
    if w.num_bits == 8 and not w.symmetric:
        return f"{name}: weights.symmetric is False (8-bit zeros)"
    if not in_order:
        return f"{name}: weights.actorder is {w.actorder!r} and weight_g_idx reorders groups"
    if w.strategy == "tensor":
        return f"{name}: weights.strategy is 'tensor'"
    if w.strategy == "group" and w.group_size % GROUP:
        return f"{name}: weights.group_size is {w.group_size}, not a multiple of {GROUP}"
    if k % GROUP:
        return f"{name}: {k} inputs, not a multiple of {GROUP}"
    return None
