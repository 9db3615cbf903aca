"""Quantized shards: a tensor-parallel rank keeps its slice of each quantized weight as shipped
(EngineConfig.quantization "keep", or "auto" on the CPU, as gpu/weights.load_model decides).

    column-parallel  q/k/v, gate/up, embed_tokens / lm_head: the rank's output rows, whole rows
                     of quant blocks (and of fp8 scale rows: the cut on a scale-block edge)
    row-parallel     o_proj, down_proj: the rank's input columns; the cut must fall on a quant
                     block edge (GGUF: 32 columns for Q4_0/Q4_1/Q8_0, 256 for the K-quants;
                     fp8: the scale block along K), so each rank holds whole blocks

    GGUF row [ blk | blk | blk | blk | blk | blk ]        fp8 per tensor: the scale on every rank
    rank 0     [ blk | blk | blk ]                         per channel [N, 1]: its rows' scales
    rank 1                       [ blk | blk | blk ]       blocks [N/Bn, K/Bk]: its blocks' scales

A cut off an edge is refused under "keep" (a ConfigError naming the tensor, the cut and the
block size: the user asked for the shipped form); under "auto" that one tensor is expanded to
the model dtype and a log line says so. The same math as one process follows: each output row
of a column cut is computed as on one process, and a row cut's groups are the same groups, so
only the all-reduce's order of the partial sums differs. The fused parameters (q|k|v,
gate|up) are built from the slices as gpu/quant_install.py builds them from whole tensors; a
form with no packed path on the device (fp8 on the CPU, Int8 on CUDA) is expanded by the
dense loader, as on one process.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Protocol

import numpy as np
import torch
from torch import nn
from troupe.config import ConfigError, EngineConfig
from troupe.gpu.cpu_q4lib import Q4Lib, Q4Options, load_q4
from troupe.gpu.fp8_weights import Fp8Weight, scale_2d
from troupe.gpu.gguf_quant import QuantBlocks
from troupe.gpu.gptq_awq_unpack import PermutedInt4, shared_input_order
from troupe.gpu.quant_install import concat_parts, replace_dense
from troupe.gpu.quant_linear import make_quant_linear
from troupe.gpu.tp_model import Target, TPDecoderModel

log = logging.getLogger(__name__)

Kept = QuantBlocks | Fp8Weight | PermutedInt4  # the last: GPTQ act-order (gpu/tp_packed_int4.py)

# a layer's fused parameter -> its HF parts in row order (gpu/quant_install.py's fusion)
_FUSED = {
    "qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "o_proj": ("self_attn.o_proj",),
    "down_proj": ("mlp.down_proj",),
}


@dataclasses.dataclass(frozen=True)
class KeepShards:
    """How a rank keeps its quantized slices: `q4` the native CPU kernel (or None), `strict`
    refuses a cut off a block edge (quantization "keep") instead of expanding that tensor."""

    q4: Q4Lib | None = None
    strict: bool = False


def kept_shards(config: EngineConfig, device: torch.device) -> KeepShards | None:
    """How a rank on `device` keeps quantized weights; None: it expands them all
    ("dequantize", or "auto" on CUDA, as gpu/weights.load_model decides on one process)."""
    mode = config.quantization
    if mode == "dequantize" or (mode == "auto" and device.type == "cuda"):
        return None
    q4 = load_q4(Q4Options.from_config(config)) if device.type == "cpu" else None
    return KeepShards(q4=q4, strict=mode == "keep")


def on_block_edge(
    name: str,
    dim: int | None,
    start: int,
    stop: int,
    size: int,
    block: int,
    form: str,
    strict: bool,
) -> bool:
    """Whether [start, stop) of dim `dim` (length `size`) holds whole blocks of `block`; off an
    edge: ConfigError when `strict`, else False (the caller expands the tensor, logged)."""
    if dim is None or (start % block == 0 and (stop % block == 0 or stop == size)):
        return True
    what = "columns" if dim == 1 else "rows"
    message = (
        f"quantization: tensor {name!r} is cut at {what} [{start}, {stop}) for its tensor-"
        f"parallel rank, not on a {form} block edge ({block} {what}); a rank keeps whole "
        "blocks"
    )
    return cannot_keep(message, strict)


def cannot_keep(message: str, strict: bool) -> bool:
    """A rank cannot keep its slice of a tensor quantized (`message` says why): ConfigError
    when `strict`, else False, logged (the caller expands the tensor)."""
    if strict:
        raise ConfigError(f"{message} (quantization='auto' expands this one tensor instead)")
    log.info("%s: expanded to the model dtype", message)
    return False


def fp8_slice(
    name: str,
    weight: torch.Tensor,
    scale: torch.Tensor,
    dim: int | None,
    start: int,
    stop: int,
    shape: tuple[int, int],
    strict: bool,
) -> Fp8Weight | None:
    """The rank's slice (`weight`: its codes, already cut) with the scales it keeps, as vLLM
    keeps them: a per-tensor scale whole; per-channel scales' rows of a row cut (dim 0) and
    all of them for a column cut; block scales' rows or columns of the slice's blocks."""
    n, k = shape
    s = scale_2d(scale, n)
    if s.numel() == 1 or dim is None:
        return Fp8Weight(weight, s)
    bn, bk = -(-n // s.shape[0]), -(-k // s.shape[1])
    block, size = (bn, n) if dim == 0 else (bk, k)
    if s.shape[dim] == 1:  # one scale along the cut dim: every rank keeps it
        return Fp8Weight(weight, s)
    if not on_block_edge(name, dim, start, stop, size, block, "fp8 scale", strict):
        return None
    cut = (
        s[start // block : -(-stop // block)]
        if dim == 0
        else s[:, start // block : -(-stop // block)]
    )
    return Fp8Weight(weight, cut.contiguous())


def expand_fp8_slice(
    weight: torch.Tensor,
    scale: torch.Tensor,
    dim: int | None,
    start: int,
    stop: int,
    shape: tuple[int, int],
) -> torch.Tensor:
    """The fp32 expansion of a slice (`weight`: its codes) at any cut, scale index by index."""
    n, k = shape
    s = scale_2d(scale, n)
    bn, bk = -(-n // s.shape[0]), -(-k // s.shape[1])
    rows = torch.arange(n) if dim != 0 else torch.arange(start, stop)
    cols = torch.arange(k) if dim != 1 else torch.arange(start, stop)
    return weight.float() * s[rows // bn][:, cols // bk]


class KeptReader(Protocol):
    """A shard reader's read_kept: the slice as shipped, None where the checkpoint ships the
    tensor dense (or the cut is off a block edge and not strict)."""

    def __call__(
        self, name: str, dim: int | None, start: int, stop: int, strict: bool
    ) -> Kept | None: ...


def install_kept(
    model: TPDecoderModel, targets: list[tuple[str, Target]], read: KeptReader, keep: KeepShards
) -> set[str]:
    """Replace the rank's projections (and vocab tables) whose parts are all kept by `read`
    with quantized layers of their slices; the HF names used (the dense loader skips them)."""
    by_name: dict[str, Target] = {}
    for name, target in targets:
        by_name.setdefault(name, target)
    shard, device, used = model.shard, model.device, set[str]()
    groups: list[tuple[nn.Module, str, list[str]]] = []
    for index, layer in enumerate(model.layers):
        for param, hf_parts in _FUSED.items():
            names = [f"model.layers.{index}.{part}.weight" for part in hf_parts]
            if all(name in by_name for name in names) and param in layer._parameters:
                groups.append((layer, param, names))
    if shard.num_vocab_rows == shard.vocab_per_rank:  # no padding rows (they must read zero)
        groups.append((model, "embed_tokens", ["model.embed_tokens.weight"]))
        if model.lm_head is not None and "lm_head.weight" in by_name:
            groups.append((model, "lm_head", ["lm_head.weight"]))
    for module, param, names in groups:
        parts: list[Kept] = []
        for name in names:
            _, dim, start, stop = by_name[name]
            part = read(name, dim, start, stop, keep.strict)
            if part is None:
                break
            parts.append(part)
        if len(parts) != len(names):
            continue
        plain, in_perm = shared_input_order(parts, names)
        try:
            fused = concat_parts(plain)
        except ValueError:
            continue  # mixed forms or scale blocks: the dense path expands them
        weight = make_quant_linear(fused, device, keep.q4, in_perm)
        if weight is not None:
            replace_dense(module, param, weight, f"tensor {names[0]!r}: the rank's slice")
            used.update(names)
    return used


def unpermuted_rows(num_rows: int, head_dim: int) -> torch.Tensor:
    """Row order undoing llama.cpp's q/k permutation within each head of a slice of heads."""
    from troupe.gpu.gguf_weights import unpermute_rotary

    return torch.from_numpy(unpermute_rotary(np.arange(num_rows), num_rows // head_dim))
