"""fp8 (e4m3) weights of HF checkpoints that ship them, kept as fp8 on CUDA.

Two layouts are read, told apart by the scale tensor beside `<name>.weight`:

    <name>.weight_scale_inv  fp32 [ceil(N/Bn), ceil(K/Bk)]   quant_method "fp8" (block-wise,
                             Bn x Bk = weight_block_size, e.g. 128 x 128): w = q * scale_inv
    <name>.weight_scale      fp32 [N, 1], [N] or []          per channel or per tensor
                             (fbgemm_fp8, compressed-tensors): w = q * scale

Activation scales (`input_scale`) are not used: the activations stay in the model dtype
(weight-only). On the CPU, or where a fused parameter mixes forms, the weights are expanded
to the model dtype at load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import torch
from troupe.gpu.model_config import ModelLoadError

_SCALES = (".weight_scale_inv", ".weight_scale")
_IGNORED = (".input_scale", ".activation_scale")


@dataclasses.dataclass(frozen=True)
class Fp8Weight:
    """w = weight * scale[n // Bn, k // Bk]."""

    weight: torch.Tensor  # float8_e4m3fn [N, K]
    scale: torch.Tensor  # fp32 [ceil(N / Bn), ceil(K / Bk)]

    @property
    def shape(self) -> tuple[int, int]:
        return self.weight.shape[0], self.weight.shape[1]

    @property
    def block_rows(self) -> int:
        return -(-self.shape[0] // self.scale.shape[0])

    def dequantize(self) -> torch.Tensor:
        n, k = self.shape
        bn, bk = self.block_rows, -(-k // self.scale.shape[1])
        s = self.scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
        return self.weight.float() * s


def scale_2d(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A scale of any shipped shape ([], [1], [N], [N, 1], block [N/Bn, K/Bk]) as 2-D fp32
    [ceil(N/Bn), ceil(K/Bk)]."""
    scale = scale.float()
    if scale.dim() == 0 or scale.numel() == 1:
        return scale.reshape(1, 1)
    if scale.dim() == 1:
        return scale.reshape(rows, 1) if scale.numel() == rows else scale.reshape(1, -1)
    return scale


def read_fp8_weights(files: list[Path]) -> dict[str, Fp8Weight]:
    """Every fp8 `<name>.weight` with its scale, by HF name."""
    from safetensors import safe_open

    weights: dict[str, torch.Tensor] = {}
    scales: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                if name.endswith(_SCALES):
                    base = name.rsplit(".", 1)[0] + ".weight"
                    scales[base] = handle.get_tensor(name)
                elif handle.get_slice(name).get_dtype() == "F8_E4M3":
                    weights[name] = handle.get_tensor(name)
    out = {}
    for name, weight in weights.items():
        if name not in scales or weight.dim() != 2:
            raise ModelLoadError(f"fp8 tensor {name!r} has no weight_scale or weight_scale_inv")
        out[name] = Fp8Weight(weight, scale_2d(scales[name], weight.shape[0]))
    return out


def expand_fp8(
    tensors: Iterator[tuple[str, torch.Tensor]], fp8: dict[str, Fp8Weight], kept: set[str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The dense stream: names in `kept` (installed as fp8) and scales dropped, other fp8
    weights expanded to fp32."""
    for name, tensor in tensors:
        if name in kept or name.endswith(_SCALES + _IGNORED):
            continue
        yield name, fp8[name].dequantize() if name in fp8 else tensor


def expand_fp8_dict(found: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`found` (HF names) with the scales dropped and each fp8 weight that has a scale expanded
    to fp32, as `expand_fp8` streams them."""
    scales = {
        name.rsplit(".", 1)[0] + ".weight": t for name, t in found.items() if name.endswith(_SCALES)
    }
    out: dict[str, torch.Tensor] = {}
    for name, tensor in found.items():
        if name.endswith(_SCALES + _IGNORED):
            continue
        if tensor.dtype == torch.float8_e4m3fn and name in scales:
            tensor = Fp8Weight(tensor, scale_2d(scales[name], tensor.shape[0])).dequantize()
        out[name] = tensor
    return out


def concat_fp8(parts: list[Fp8Weight]) -> Fp8Weight:
    """Stack along N (fused qkv, gate_up); block scales must tile each part whole."""
    weight = torch.cat([p.weight for p in parts])
    if all(p.scale.numel() == 1 for p in parts):  # per tensor: one scale per row after fusing
        return Fp8Weight(weight, torch.cat([p.scale.expand(p.shape[0], 1) for p in parts]))
    bn, cols = parts[0].block_rows, parts[0].scale.shape[1]
    if any(p.block_rows != bn or p.scale.shape[1] != cols or p.shape[0] % bn for p in parts):
        raise ValueError("cannot fuse fp8 tensors with different scale blocks")
    return Fp8Weight(weight, torch.cat([p.scale for p in parts]))
