"""GPT-OSS's expert tensors, as checkpoints ship them, in MoeLayer's layout (gpu/moe_layer.py:
w13 [E, 2I, H] gate rows then up rows, w2 [E, H, I]; biases b13 [E, 2I] gate | up).

    mlp.experts.gate_up_proj        [E, H, 2I], gate and up interleaved along 2I (transformers'
                                    own layout: gate at the even columns)
    mlp.experts.gate_up_proj_bias   [E, 2I], interleaved the same way
    mlp.experts.down_proj           [E, I, H]
    mlp.experts.*_blocks, *_scales  OpenAI's MXFP4 files (gpt-oss-20b / -120b as released):
                                    per expert and output row, groups of 32 inputs, each 16
                                    bytes of two e2m1 codes (low nibble first) and one e8m0
                                    exponent (bias 127); gate_up's rows interleaved as above

MXFP4 is dequantized here, at load, on the model's device (bf16 holds every e2m1 value times a
power of two exactly), for a model of dense experts; a model that keeps them packed
(MoeConfig.mxfp4) gets the blocks [E, N, K / 2] and scales, gate_up's rows in w13's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from troupe.gpu.model_config import ModelLoadError
from troupe.kernels.mxfp4 import unpack

_PACKED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def gpt_oss_tensors(
    tensors: Iterable[tuple[str, torch.Tensor]], device: torch.device, keep_mxfp4: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with the experts' turned into MoeLayer's layout (module doc);
    the others as given. An MXFP4 weight's blocks and scales may come in either order; they
    are dequantized on `device`, or with keep_mxfp4 passed on packed."""
    pending: dict[str, torch.Tensor] = {}
    for name, tensor in tensors:
        stem, _, part = name.rpartition("_")
        if stem.endswith(_PACKED) and part in ("blocks", "scales") and keep_mxfp4:
            packed = tensor.flatten(-2) if part == "blocks" else tensor  # [E, N, K/2 | K/32]
            yield name, _gate_then_up(packed) if stem.endswith("gate_up_proj") else packed
        elif stem.endswith(_PACKED) and part in ("blocks", "scales"):
            other = pending.pop(f"{stem}_{'scales' if part == 'blocks' else 'blocks'}", None)
            if other is None:
                pending[name] = tensor
                continue
            blocks, scales = (tensor, other) if part == "blocks" else (other, tensor)
            weight = dequantize_mxfp4(blocks.to(device), scales.to(device))  # w13's / w2's axes
            yield stem, _gate_then_up(weight) if stem.endswith("gate_up_proj") else weight
        elif name.endswith(_PACKED):
            weight = tensor.transpose(1, 2)
            yield name, _gate_then_up(weight) if name.endswith("gate_up_proj") else weight
        elif name.endswith("mlp.experts.gate_up_proj_bias"):
            yield name, _gate_then_up(tensor)
        else:
            yield name, tensor
    if pending:
        raise ModelLoadError(f"MXFP4 weights without their pair: {', '.join(sorted(pending))}")


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[..., G * 32] bf16 of blocks [..., G, 16] (uint8, two codes a byte) and scales [..., G]
    (uint8 exponents, bias 127)."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise ModelLoadError(
            f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)}: expected "
            "[..., G, 16] and [..., G]"
        )
    return unpack(blocks.to(torch.uint8).flatten(-2), scales)


def _gate_then_up(interleaved: torch.Tensor) -> torch.Tensor:
    """[E, 2I, ...] with gate and up rows alternating -> gate rows, then up rows."""
    return torch.cat([interleaved[:, 0::2], interleaved[:, 1::2]], dim=1).contiguous()
