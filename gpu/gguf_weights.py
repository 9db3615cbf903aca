"""GGUF reading (llama, gemma3, qwen2, qwen3, qwen3moe, deepseek2 archs): metadata to ModelConfig,
tensors to HF names and layout (gpu/gguf_arch.py, gpu/gguf_deepseek.py)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from troupe.gguf_file import GGUFFormatError, TensorInfo, read_gguf_tensor_infos, tensor_bytes
from troupe.gpu.gguf_arch import (
    ARCHITECTURES,
    HF_CONFIG_ARCHS,
    MERGED_EXPERT_ARCHS,
    hf_config,
    hf_name,
    norm_offset,
)
from troupe.gpu.gguf_deepseek import deepseek2_hf_config, split_merged_tensors
from troupe.gpu.gguf_quant import BLOCK_BYTES, QuantBlocks, from_gguf
from troupe.gpu.model_config import ModelConfig, ModelLoadError


def _read(path: Path) -> tuple[dict[str, Any], list[TensorInfo]]:
    """Metadata and tensor directory, parsed once per file version (read_config, the quantized
    pass and the dense pass all ask; a 49k-token vocabulary takes a while to walk)."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read ({exc})") from exc
    return _read_version(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _read_version(path: Path, mtime_ns: int, size: int) -> tuple[dict[str, Any], list[TensorInfo]]:
    del mtime_ns, size  # cache keys only
    try:
        return read_gguf_tensor_infos(path)
    except GGUFFormatError as exc:
        raise ModelLoadError(str(exc)) from exc


def forget_gguf_directories() -> None:
    """Drop the parsed metadata kept for the load (~10 MiB for a 49k vocabulary and its merges,
    which the tokenizer parses for itself): call once the model is loaded."""
    _read_version.cache_clear()


def read_gguf_config(path: Path) -> ModelConfig:
    """ModelConfig from a GGUF file's metadata."""
    metadata, infos = _read(path)
    names = {t.name for t in infos}
    fields = {k: v for k, v in metadata.items() if k != "tokenizer.ggml.merges"}
    arch = _arch(path)
    if arch in HF_CONFIG_ARCHS:
        cfg = hf_config(fields, arch, has_output_weight="output.weight" in names)
        if "rope_factors_long.weight" in names:  # Phi-3's long-context scaling
            cfg["rope_scaling"] = _longrope(path, infos)
        if arch == "nemotron":  # its bias flags: what the file has
            cfg["attention_bias"] = "blk.0.attn_q.bias" in names
            cfg["mlp_bias"] = "blk.0.ffn_up.bias" in names
        return ModelConfig.from_hf_dict(cfg)
    if _arch(path) == "deepseek2":
        cfg = deepseek2_hf_config(fields, has_output_weight="output.weight" in names)
        return ModelConfig.from_hf_dict(cfg)
    return llama_gguf_config(fields, has_output_weight="output.weight" in names)


def _longrope(path: Path, infos: list[TensorInfo]) -> dict[str, Any]:
    """The longrope scaling whose per-dim factors the file holds as tensors (HF's lists)."""
    by_name = {info.name: info for info in infos}
    factors = {}
    for kind in ("long", "short"):
        info = by_name.get(f"rope_factors_{kind}.weight")
        if info is None:
            raise ModelLoadError(f"{path}: GGUF has rope_factors_long but no rope_factors_{kind}")
        factors[f"{kind}_factor"] = _dequantize(path, info).reshape(-1).tolist()
    return {"rope_type": "longrope", **factors}


def llama_gguf_config(fields: dict[str, Any], *, has_output_weight: bool) -> ModelConfig:
    """Build from decoded GGUF metadata (key -> python value); only the llama arch."""
    arch = fields.get("general.architecture")
    if arch != "llama":
        raise ModelLoadError(
            f"GGUF general.architecture {arch!r} is not supported; expected 'llama'"
        )

    def need(key: str) -> Any:
        if f"llama.{key}" not in fields:
            raise ModelLoadError(f"GGUF metadata is missing 'llama.{key}'")
        return fields[f"llama.{key}"]

    hidden = int(need("embedding_length"))
    num_heads = int(need("attention.head_count"))
    vocab = fields.get("llama.vocab_size")
    if vocab is None:
        vocab = len(fields.get("tokenizer.ggml.tokens", ()))
    eos = fields.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        model_type="llama",
        hidden_size=hidden,
        num_layers=int(need("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(fields.get("llama.attention.head_count_kv", num_heads)),
        head_dim=int(fields.get("llama.rope.dimension_count", hidden // num_heads)),
        intermediate_size=int(need("feed_forward_length")),
        vocab_size=int(vocab),
        rms_norm_eps=float(fields.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(fields.get("llama.rope.freq_base", 10000.0)),
        tie_word_embeddings=not has_output_weight,
        max_position_embeddings=int(fields.get("llama.context_length", 4096)),
        eos_token_ids=(int(eos),) if eos is not None else (),
        torch_dtype=torch.float32,
    )


def _arch(path: Path) -> str:
    arch = _read(path)[0].get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: GGUF general.architecture {arch!r} is not supported; expected one of "
            f"{', '.join(ARCHITECTURES)}"
        )
    return str(arch)


# Unquantized ggml types read here directly (the gguf package, ~0.1 s to import, is for the rest)
_PLAIN: dict[int, np.dtype[Any]] = {0: np.dtype("<f4"), 1: np.dtype("<f2")}  # F32, F16


def _dequantize(path: Path, info: TensorInfo) -> np.ndarray:
    """One tensor as a writable fp32 array of `info.shape`."""
    plain = _PLAIN.get(info.ggml_type)
    if plain is not None:
        num_values = int(np.prod(info.shape))
        raw = tensor_bytes(path, info, num_values * plain.itemsize)
        data: np.ndarray = raw.view(plain).astype(np.float32)  # a copy: the file is mmapped
        return data.reshape(info.shape)
    import gguf

    qtype = gguf.GGMLQuantizationType(info.ggml_type)
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    num_values = int(np.prod(info.shape))
    raw = tensor_bytes(path, info, num_values // block * type_size)
    rows = raw.reshape(-1, info.shape[-1] // block * type_size)
    try:
        data = gguf.quants.dequantize(rows, qtype)
    except NotImplementedError as exc:
        raise ModelLoadError(
            f"{path}: tensor {info.name!r} uses quantization {qtype.name}, "
            "which the gguf package cannot dequantize"
        ) from exc
    return np.array(data, dtype=np.float32).reshape(info.shape)  # a copy: the file is mmapped


def unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rotary pairs) back to HF's halves.

    llama.cpp stores each head's rows as (pair, 2) where HF has (2, pair); swap them back.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return (
        weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def _rotary_heads(name: str, config: ModelConfig) -> int | None:
    """Heads whose rows llama.cpp permuted (q and k of the llama arch); None otherwise."""
    if config.model_type != "llama":
        return None
    if rest_is(name, "attn_q.weight"):
        return config.num_heads
    if rest_is(name, "attn_k.weight"):
        return config.num_kv_heads
    return None


def iter_gguf_tensors(
    path: Path, config: ModelConfig, skip: frozenset[str] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, fp32 tensor) for every tensor not in `skip` (HF names), dequantized with
    gguf.quants."""
    _, infos = _read(path)
    arch = _arch(path)
    for info in infos:
        name = hf_name(info.name, arch)
        if name is None or name in skip:
            continue
        data = _dequantize(path, info)
        heads = _rotary_heads(info.name, config)
        if heads is not None:
            data = unpermute_rotary(data, heads)
        if offset := norm_offset(info.name, arch):
            data += np.float32(offset)
        if rest_is(info.name, "ffn_gate_inp_shexp.weight"):  # a vector: HF's gate is [1, H]
            data = data.reshape(1, -1)
        yield name, torch.from_numpy(np.ascontiguousarray(data))
    if arch in MERGED_EXPERT_ARCHS:
        for name, data in split_merged_tensors(infos, lambda info: _dequantize(path, info)):
            if name not in skip:
                yield name, torch.from_numpy(np.ascontiguousarray(data))


def iter_gguf_quantized(path: Path, config: ModelConfig) -> Iterator[tuple[str, QuantBlocks]]:
    """(HF name, blocks as shipped) for every 2-D tensor in a form gguf_quant.py keeps; not q
    and k where their dims are reordered for a partial rotary (Phi-4-mini's, Nemotron's): those
    the loader expands."""
    _, infos = _read(path)
    arch = _arch(path)
    reordered = ("attn_q.weight", "attn_k.weight", "attn_qkv.weight")
    for info in infos:
        name = hf_name(info.name, arch)
        if name is None or info.ggml_type not in BLOCK_BYTES or len(info.shape) != 2:
            continue
        if config.head_order is not None and any(rest_is(info.name, r) for r in reordered):
            continue
        block, type_size = BLOCK_BYTES[info.ggml_type]
        if info.shape[1] % block:
            continue
        num_bytes = info.shape[0] * info.shape[1] // block * type_size
        raw = tensor_bytes(path, info, num_bytes)
        blocks = from_gguf(raw, info.ggml_type, (info.shape[0], info.shape[1]))
        heads = _rotary_heads(info.name, config)
        if heads is not None:
            order = unpermute_rotary(np.arange(info.shape[0]), heads)
            blocks = blocks.rows(torch.from_numpy(order))
        yield name, blocks


def rest_is(name: str, suffix: str) -> bool:
    return name.startswith("blk.") and name.endswith("." + suffix)
