"""Shard-by-shard weight loading: each tensor-parallel rank reads only its slice of each tensor.

safetensors   `get_slice` reads the rows (column-parallel) or columns (row-parallel) of the
              rank, never the whole tensor
GGUF          the file is memory-mapped; a row slice dequantizes only its rows, a column
              slice only its quant blocks when the slice starts and ends on a block edge
              (else the rows are dequantized whole, then cut: noted, not hit by common shapes);
              llama.cpp's q/k row permutation is within a head, so a slice of whole heads is
              unpermuted on its own

fp8 (e4m3)    the codes' slice expanded with its scales, scale by scale, at any cut
GPTQ / AWQ    each packed linear converted whole, then cut (gpu/tp_packed_int4.py)

`read` gives dense slices in the model's dtype. `read_kept` gives a slice as shipped (GGUF quant
blocks, fp8 codes with the scales they keep): gpu/tp_quant.py installs those where the config
keeps quantized weights, and `read` fills the rest. A tensor may feed several targets (a fused expert tensor's
gate and up halves). DeepSeek's latent attention and shared experts: gpu/tp_mla.py. Gemma 3's norms hold 1 + weight, as on one GPU (gpu/weight_fill.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from troupe.gguf_file import TensorInfo, tensor_bytes
from troupe.gpu.fp8_weights import Fp8Weight
from troupe.gpu.gemma3_layer import Gemma3Layer
from troupe.gpu.gguf_arch import MERGED_EXPERT_ARCHS, hf_name, norm_offset
from troupe.gpu.gguf_quant import BLOCK_BYTES, Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, QuantBlocks, from_gguf
from troupe.gpu.gguf_weights import read_gguf_config, rest_is, unpermute_rotary
from troupe.gpu.model_config import ModelConfig, ModelLoadError
from troupe.gpu.quant_linear import Projection
from troupe.gpu.safetensors_shards import open_shards
from troupe.gpu.tp_mla import TPMlaLayer, mla_targets
from troupe.gpu.tp_model import Target, TPDecoderLayer, TPDecoderModel
from troupe.gpu.tp_moe import TPMoeLayer, moe_targets
from troupe.gpu.tp_packed_int4 import PackedInt4ShardReader
from troupe.gpu.tp_quant import (
    KeepShards,
    Kept,
    expand_fp8_slice,
    fp8_slice,
    install_kept,
    on_block_edge,
    unpermuted_rows,
)
from troupe.gpu.weights import packed_reader, safetensors_files

GGML_NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}


class ShardReader(Protocol):
    """Reads one slice of a named tensor from a checkpoint."""

    def has(self, name: str) -> bool: ...

    def read(self, name: str, dim: int | None, start: int, stop: int) -> torch.Tensor:
        """The whole tensor (dim None) or [start, stop) of dim 0, 1 or 2 (fused experts),
        dense (quantized weights expanded)."""
        ...

    def read_kept(
        self, name: str, dim: int | None, start: int, stop: int, strict: bool
    ) -> Kept | None:
        """The slice as shipped (gpu/tp_quant.py); None where the tensor is dense, or its cut is
        off a block edge and not `strict` (strict: ConfigError)."""
        ...


class SafetensorsShardReader:
    """An HF folder's safetensors files, every file kept open while loading."""

    def __init__(self, folder: Path, stack: contextlib.ExitStack) -> None:
        self._handles = open_shards(safetensors_files(folder), stack)

    def has(self, name: str) -> bool:
        return name in self._handles

    def read(self, name: str, dim: int | None, start: int, stop: int) -> torch.Tensor:
        part = self._handles[name].get_slice(name)
        tensor = _cut(part, dim, start, stop)
        if tensor.dtype == torch.float8_e5m2:
            raise ModelLoadError(f"{name}: fp8 e5m2 weights are not supported")
        if tensor.dtype != torch.float8_e4m3fn:
            return tensor
        shape = self._fp8_shape(name, part, dim)
        return expand_fp8_slice(tensor, self._scale(name), dim, start, stop, shape)

    def read_kept(
        self, name: str, dim: int | None, start: int, stop: int, strict: bool
    ) -> Fp8Weight | None:
        part = self._handles[name].get_slice(name)
        if part.get_dtype() != "F8_E4M3":
            return None
        shape = self._fp8_shape(name, part, dim)
        weight = _cut(part, dim, start, stop)
        return fp8_slice(name, weight, self._scale(name), dim, start, stop, shape, strict)

    def _scale(self, name: str) -> torch.Tensor:
        base = name.removesuffix(".weight")
        for scale in (base + ".weight_scale_inv", base + ".weight_scale"):
            if scale in self._handles:
                tensor: torch.Tensor = self._handles[scale].get_tensor(scale)
                return tensor
        raise ModelLoadError(f"fp8 tensor {name!r} has no weight_scale or weight_scale_inv")

    @staticmethod
    def _fp8_shape(name: str, part: Any, dim: int | None) -> tuple[int, int]:
        shape = tuple(part.get_shape())
        if len(shape) != 2 or dim not in (None, 0, 1):
            raise ModelLoadError(f"{name}: fp8 tensors of shape {shape} are not sliced here")
        return int(shape[0]), int(shape[1])


def _cut(part: Any, dim: int | None, start: int, stop: int) -> torch.Tensor:
    if dim is None:
        tensor: torch.Tensor = part[:]
    elif dim == 0:
        tensor = part[start:stop]
    elif dim == 1:
        tensor = part[:, start:stop]
    else:
        tensor = part[:, :, start:stop]
    return tensor


class GGUFShardReader:
    """A GGUF file's tensors under HF names, sliced before dequantizing."""

    def __init__(self, path: Path, config: ModelConfig) -> None:
        from troupe.gpu.gguf_weights import _read

        self._path = path
        self._config = config
        metadata, infos = _read(path)
        self._arch = str(metadata.get("general.architecture"))
        if self._arch in MERGED_EXPERT_ARCHS:  # merged experts (DeepSeek: kv_b split per head)
            raise ModelLoadError(
                f"{path}: a GGUF of arch {self._arch!r} (merged experts) cannot be loaded with "
                "tensor_parallel_size > 1; use its HF safetensors folder"
            )
        self._infos: dict[str, TensorInfo] = {}
        for info in infos:
            name = hf_name(info.name, self._arch)
            if name is not None:
                self._infos[name] = info

    def has(self, name: str) -> bool:
        return name in self._infos

    def read(self, name: str, dim: int | None, start: int, stop: int) -> torch.Tensor:
        import gguf

        info = self._infos[name]
        if dim is not None and dim > 1:
            raise ModelLoadError(f"{name}: GGUF slices of dim {dim} are not supported")
        qtype = gguf.GGMLQuantizationType(info.ggml_type)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        cols = int(info.shape[-1])
        row_bytes = cols // block * type_size
        num_rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        raw = tensor_bytes(self._path, info, num_rows * row_bytes).reshape(num_rows, row_bytes)
        cut_after = False
        if dim == 0:
            raw = raw[start:stop]
        elif dim == 1 and start % block == 0 and stop % block == 0:
            raw = raw[:, start // block * type_size : stop // block * type_size]
        elif dim == 1:
            cut_after = True
        data = np.array(gguf.quants.dequantize(np.ascontiguousarray(raw), qtype), np.float32)
        if cut_after:
            data = np.ascontiguousarray(data[:, start:stop])
        if dim is None:
            data = data.reshape(info.shape)
        if self._config.model_type == "llama" and (
            rest_is(info.name, "attn_q.weight") or rest_is(info.name, "attn_k.weight")
        ):
            data = unpermute_rotary(data, data.shape[0] // self._config.head_dim)
        if offset := norm_offset(info.name, self._arch):  # Gemma's norms: stored as 1 + w
            data = data + np.float32(offset)
        return torch.from_numpy(data)

    def read_kept(
        self, name: str, dim: int | None, start: int, stop: int, strict: bool
    ) -> QuantBlocks | None:
        info = self._infos[name]
        if info.ggml_type not in BLOCK_BYTES or len(info.shape) != 2 or dim not in (None, 0, 1):
            return None  # dense in the file, or a form gguf_quant.py does not keep
        block, type_size = BLOCK_BYTES[info.ggml_type]
        n, k = int(info.shape[0]), int(info.shape[1])
        form = GGML_NAMES[info.ggml_type]
        if k % block:
            return None
        if dim == 1 and not on_block_edge(name, dim, start, stop, k, block, form, strict):
            return None  # a row cut (dim 0) takes whole rows of blocks: always on an edge
        raw = tensor_bytes(self._path, info, n * (k // block) * type_size).reshape(n, -1)
        if dim == 0:
            raw, n = raw[start:stop], stop - start
        elif dim == 1:
            raw, k = raw[:, start // block * type_size : stop // block * type_size], stop - start
        blocks = from_gguf(raw, info.ggml_type, (n, k))
        if self._config.model_type == "llama" and (
            rest_is(info.name, "attn_q.weight") or rest_is(info.name, "attn_k.weight")
        ):  # a slice of whole heads: llama.cpp's permutation is undone within each
            blocks = blocks.rows(unpermuted_rows(n, self._config.head_dim))
        return blocks


@contextlib.contextmanager
def open_shard_reader(path: Path) -> Iterator[ShardReader]:
    """The reader of an HF folder (GPTQ / AWQ and integer compressed-tensors ones:
    gpu/tp_packed_int4.py) or a .gguf file."""
    with contextlib.ExitStack() as stack:
        if path.suffix == ".gguf":
            yield GGUFShardReader(path, read_gguf_config(path))
            return
        dense = SafetensorsShardReader(path, stack)
        packed = packed_reader(path)  # strictness is read_kept's, per tensor
        if packed is None:
            yield dense
            return
        stack.enter_context(packed)
        yield PackedInt4ShardReader(dense, packed)


def shard_targets(model: TPDecoderModel, reader: ShardReader) -> list[tuple[str, Target]]:
    """(HF name, where this rank's slice of it goes), one pair per destination."""
    shard = model.shard
    hd = model.config.head_dim
    q0, nq = shard.first_head * hd, shard.num_heads * hd
    k0, nk = shard.first_kv_head * hd, shard.num_kv_heads * hd
    i0, ni = shard.rank * shard.intermediate_size, shard.intermediate_size
    v0, nv = shard.vocab_start, shard.num_vocab_rows
    assert isinstance(model.embed_tokens, torch.Tensor)
    targets: dict[str, Target] = {
        "model.embed_tokens.weight": (model.embed_tokens[:nv], 0, v0, v0 + nv),
        "model.norm.weight": (model.norm, None, 0, 0),
    }
    if model.lm_head is not None:
        assert isinstance(model.lm_head, torch.Tensor)
        targets["lm_head.weight"] = (model.lm_head[:nv], 0, v0, v0 + nv)
    experts: list[tuple[str, Target]] = []
    for index, layer in enumerate(model.layers):
        assert isinstance(layer, TPDecoderLayer)
        p = f"model.layers.{index}."
        targets |= {
            p + "input_layernorm.weight": (layer.input_layernorm, None, 0, 0),
            p + "post_attention_layernorm.weight": (layer.post_attention_layernorm, None, 0, 0),
        }
        fused = reader.has(p + "mlp.experts.gate_up_proj")
        if isinstance(layer, TPMlaLayer):  # DeepSeek: latent attention (and its experts)
            experts += mla_targets(layer, p, shard, fused=fused)
        else:
            qkv, o = _dense(layer.qkv_proj), _dense(layer.o_proj)
            targets |= {
                p + "self_attn.q_proj.weight": (qkv[:nq], 0, q0, q0 + nq),
                p + "self_attn.k_proj.weight": (qkv[nq : nq + nk], 0, k0, k0 + nk),
                p + "self_attn.v_proj.weight": (qkv[nq + nk :], 0, k0, k0 + nk),
                p + "self_attn.o_proj.weight": (o, 1, q0, q0 + nq),
            }
        if isinstance(layer, TPMoeLayer):
            experts += moe_targets(layer, p, shard, fused=fused)
        elif not shard.full.is_sparse(index):  # DeepSeek's experts: in mla_targets
            gate_up, down = _dense(layer.gate_up_proj), _dense(layer.down_proj)
            targets[p + "mlp.gate_proj.weight"] = (gate_up[:ni], 0, i0, i0 + ni)
            targets[p + "mlp.up_proj.weight"] = (gate_up[ni:], 0, i0, i0 + ni)
            targets[p + "mlp.down_proj.weight"] = (down, 1, i0, i0 + ni)
        if layer.qkv_bias is not None:
            b = layer.qkv_bias
            targets[p + "self_attn.q_proj.bias"] = (b[:nq], 0, q0, q0 + nq)
            targets[p + "self_attn.k_proj.bias"] = (b[nq : nq + nk], 0, k0, k0 + nk)
            targets[p + "self_attn.v_proj.bias"] = (b[nq + nk :], 0, k0, k0 + nk)
        if layer.q_norm is not None and layer.k_norm is not None:
            targets[p + "self_attn.q_norm.weight"] = (layer.q_norm, None, 0, 0)
            targets[p + "self_attn.k_norm.weight"] = (layer.k_norm, None, 0, 0)
        if isinstance(layer, Gemma3Layer):
            pre, post = layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm
            targets[p + "pre_feedforward_layernorm.weight"] = (pre, None, 0, 0)
            targets[p + "post_feedforward_layernorm.weight"] = (post, None, 0, 0)
    return list(targets.items()) + experts


def _dense(weight: Projection) -> torch.Tensor:
    assert isinstance(weight, torch.Tensor), "tensor-parallel shards are dense"
    return weight


@torch.inference_mode()
def load_shard(
    model: TPDecoderModel, reader: ShardReader, source: str, keep: KeepShards | None = None
) -> None:
    """Fill every parameter of the rank's model with its slice; pad vocab rows are zero. With
    `keep`, quantized slices stay as shipped where a packed path runs them (gpu/tp_quant.py)."""
    targets = shard_targets(model, reader)
    missing = list(dict.fromkeys(name for name, _ in targets if not reader.has(name)))
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelLoadError(f"{source}: missing weights for {', '.join(missing[:5])}{more}")
    kept = set() if keep is None else install_kept(model, targets, reader.read_kept, keep)
    for name, (dest, dim, start, stop) in targets:
        if name in kept:
            continue
        tensor = reader.read(name, dim, start, stop)
        if tuple(tensor.shape) != tuple(dest.shape):
            raise ModelLoadError(
                f"{source}: slice of {name!r} has shape {tuple(tensor.shape)}, expected "
                f"{tuple(dest.shape)} on rank {model.shard.rank} of {model.shard.size}"
            )
        dest.copy_(tensor)
    nv = model.shard.num_vocab_rows
    for table in (model.embed_tokens, model.lm_head):
        if isinstance(table, torch.Tensor):
            table[nv:].zero_()  # padding rows: their logits are cut off after the gather
    if model.config.is_gemma:  # Gemma's RMSNorm scales by (1 + weight): fold the 1 in once
        for name, param in model.named_parameters():
            if name.endswith("norm"):
                param.add_(1.0)
