"""GGUF quantized blocks -> two in-memory forms that keep the shipped bits (no re-quantisation).

    Int4Blocks   Q4_0, Q4_1, Q4_K    w[n, k] = scale[n, g] * q[n, k] + bias[n, g],  q in 0..15
    Int8Blocks   Q8_0, Q6_K          w[n, k] = scale[n, g] * q[n, k],  q int8 (Q6_K: -32..31)

g = k // group_size (32, or 16 for Q6_K). Both hold the codes of the file and fp32 per-group
factors computed as gguf-py computes them (Q4_0: bias = -8 d; Q4_K: scale = d * sc, bias =
-(dmin * m)), so `dequantize()` is bit-identical to `gguf.quants.dequantize`. Block layouts
(ggml, little-endian, d/dmin fp16):

    Q4_0  18 B / 32: d | 16 B nibbles: byte j = element j (low), element j + 16 (high)
    Q4_1  20 B / 32: d | m | 16 B nibbles as Q4_0                     w = d q + m
    Q8_0  34 B / 32: d | 32 int8                                      w = d q
    Q4_K 144 B / 256: d | dmin | 12 B six-bit (sc, m) x 8 | 128 B nibbles: chunk c of 64 holds
                      sub-block 2c in low nibbles, 2c + 1 in high    w = d sc q - dmin m
    Q6_K 210 B / 256: 128 B ql | 64 B qh | 16 int8 sc | d           w = d sc (q - 32)

Int4Blocks keeps Q4_0's nibble order (the Triton kernels read it): per group of 32, byte j
holds element j in its low nibble and element j + 16 in its high one. Q4_0 and Q4_1 codes are
the file's bytes as they are; Q4_K's are reordered into it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

Q4_0, Q4_1, Q8_0, Q4_K, Q6_K = 2, 3, 8, 12, 14  # ggml type ids
BLOCK_BYTES = {Q4_0: (32, 18), Q4_1: (32, 20), Q8_0: (32, 34), Q4_K: (256, 144), Q6_K: (256, 210)}


@dataclasses.dataclass(frozen=True)
class Int4Blocks:
    """w = scale * q + bias per group of `group_size` along K; two 4-bit codes a byte."""

    packed: torch.Tensor  # uint8 [N, K // 2], Q4_0 nibble order (module docstring)
    scale: torch.Tensor  # fp32 [N, K // group_size]
    bias: torch.Tensor  # fp32 [N, K // group_size]
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 2

    def codes(self) -> torch.Tensor:
        """uint8 [N, K] in 0..15."""
        p = self.packed.reshape(self.shape[0], -1, 16)
        return torch.cat((p & 15, p >> 4), dim=-1).reshape(self.shape)

    def dequantize(self) -> torch.Tensor:
        n, k = self.shape
        q = self.codes().reshape(n, -1, self.group_size).float()
        return (q * self.scale[..., None] + self.bias[..., None]).reshape(n, k)

    def rows(self, index: torch.Tensor) -> Int4Blocks:
        return Int4Blocks(self.packed[index], self.scale[index], self.bias[index], self.group_size)

    def columns(self, start: int, stop: int) -> Int4Blocks:
        """Inputs [start, stop), both on group edges (a tensor-parallel rank's cut)."""
        first, last = start // self.group_size, -(-stop // self.group_size)
        return Int4Blocks(
            self.packed[:, start // 2 : stop // 2].contiguous(),
            self.scale[:, first:last].contiguous(),
            self.bias[:, first:last].contiguous(),
            self.group_size,
        )


@dataclasses.dataclass(frozen=True)
class Int8Blocks:
    """w = scale * q per group of `group_size` along K."""

    codes: torch.Tensor  # int8 [N, K]
    scale: torch.Tensor  # fp32 [N, K // group_size]
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.codes.shape[1]

    def dequantize(self) -> torch.Tensor:
        n, k = self.shape
        q = self.codes.reshape(n, -1, self.group_size).float()
        return (q * self.scale[..., None]).reshape(n, k)

    def rows(self, index: torch.Tensor) -> Int8Blocks:
        return Int8Blocks(self.codes[index], self.scale[index], self.group_size)

    def columns(self, start: int, stop: int) -> Int8Blocks:
        """Inputs [start, stop), both on group edges (a tensor-parallel rank's cut)."""
        first, last = start // self.group_size, -(-stop // self.group_size)
        return Int8Blocks(
            self.codes[:, start:stop].contiguous(),
            self.scale[:, first:last].contiguous(),
            self.group_size,
        )


QuantBlocks = Int4Blocks | Int8Blocks


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] in 0..15 -> [N, K // 2] in Q4_0 nibble order."""
    groups = codes.reshape(codes.shape[0], -1, 32)
    return (groups[..., :16] | (groups[..., 16:] << 4)).reshape(codes.shape[0], -1)


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 from its two bytes [..., 2] -> fp32 [...]."""
    return raw.contiguous().view(torch.float16).squeeze(-1).float()


def from_gguf(raw: np.ndarray, ggml_type: int, shape: tuple[int, int]) -> QuantBlocks:
    """The blocks of one 2-D tensor (`raw`: its bytes, uint8) in one of the forms above."""
    n, k = shape
    block, size = BLOCK_BYTES[ggml_type]
    b = torch.from_numpy(np.array(raw, dtype=np.uint8)).reshape(n, k // block, size)  # a copy
    if ggml_type in (Q4_0, Q4_1):
        d = _f16(b[..., 0:2])
        bias = -8.0 * d if ggml_type == Q4_0 else _f16(b[..., 2:4])
        qs = b[..., 2:18] if ggml_type == Q4_0 else b[..., 4:20]
        return Int4Blocks(qs.reshape(n, k // 2), d, bias, 32)  # the file's nibble order
    if ggml_type == Q8_0:
        codes8 = b[..., 2:].contiguous().view(torch.int8).reshape(n, k)
        return Int8Blocks(codes8, _f16(b[..., 0:2]), 32)
    if ggml_type == Q4_K:
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, m = _k4_scale_min(b[..., 4:16])  # [n, blocks, 8]
        qs = b[..., 16:].reshape(n, k // block, 4, 32)  # chunk of 64 = two sub-blocks
        codes = torch.stack((qs & 15, qs >> 4), dim=3).reshape(n, k)
        scale = (d[..., None] * sc.float()).reshape(n, -1)
        bias = -(dmin[..., None] * m.float()).reshape(n, -1)
        return Int4Blocks(pack_nibbles(codes), scale, bias, 32)
    if ggml_type == Q6_K:
        ql = b[..., 0:128].reshape(n, -1, 2, 1, 64)  # halves of 128 elements
        qh = b[..., 128:192].reshape(n, -1, 2, 1, 32)
        sc = b[..., 192:208].contiguous().view(torch.int8).float()  # [n, blocks, 16]
        d = _f16(b[..., 208:210])
        low = torch.cat((ql & 15, ql >> 4), dim=3).reshape(n, -1, 2, 4, 32)
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 1, 4, 1)
        high = (qh >> shifts) & 3
        q6 = (low | (high << 4)).to(torch.int16) - 32
        return Int8Blocks(q6.to(torch.int8).reshape(n, k), (d[..., None] * sc).reshape(n, -1), 16)
    raise ValueError(f"ggml type {ggml_type} is not one of Q4_0, Q4_1, Q8_0, Q4_K, Q6_K")


def _k4_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's 12 bytes -> (sc, m) [..., 8], six bits each (ggml get_scale_min_k4)."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = torch.cat((d & 63, (md & 15) | ((d >> 2) & 48)), dim=-1)
    mn = torch.cat((m & 63, (md >> 4) | ((m >> 2) & 48)), dim=-1)
    return sc, mn


def concat_rows(parts: list[QuantBlocks]) -> QuantBlocks:
    """Stack tensors of one form and group size along N (fused qkv, gate_up)."""
    first = parts[0]
    if isinstance(first, Int4Blocks):
        int4 = [p for p in parts if isinstance(p, Int4Blocks)]
        if len(int4) == len(parts) and all(p.group_size == first.group_size for p in int4):
            return Int4Blocks(
                torch.cat([p.packed for p in int4]),
                torch.cat([p.scale for p in int4]),
                torch.cat([p.bias for p in int4]),
                first.group_size,
            )
    else:
        int8 = [p for p in parts if isinstance(p, Int8Blocks)]
        if len(int8) == len(parts) and all(p.group_size == first.group_size for p in int8):
            return Int8Blocks(
                torch.cat([p.codes for p in int8]),
                torch.cat([p.scale for p in int8]),
                first.group_size,
            )
    raise ValueError("cannot fuse tensors of different quantization forms")
