"""Weight sources: HF folders (safetensors, single or sharded), GGUF files, random weights."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from troupe.config import ConfigError, Quantization
from troupe.gpu.cpu_q4lib import Q4Options, load_q4
from troupe.gpu.ct_format import read_ct_format
from troupe.gpu.ct_reader import CtReader
from troupe.gpu.fp8_weights import expand_fp8, read_fp8_weights
from troupe.gpu.gguf_weights import (
    forget_gguf_directories,
    iter_gguf_quantized,
    iter_gguf_tensors,
    read_gguf_config,
)
from troupe.gpu.gptq_awq_format import read_packed_int4_format
from troupe.gpu.gptq_awq_reader import PackedInt4Reader
from troupe.gpu.hf_families import HUNYUAN_TYPES
from troupe.gpu.model_config import ModelConfig, ModelLoadError
from troupe.gpu.models import DecoderModel
from troupe.gpu.quant_install import install_quantized
from troupe.gpu.weight_fill import fill_weights
from troupe.kernels.ops import KernelBackend

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def read_config(path: Path, hf_overrides: Mapping[str, Any] | None = None) -> ModelConfig:
    """ModelConfig of an HF folder (config.json's keys in `hf_overrides` replaced:
    gpu/hf_overrides.py) or a .gguf file (which has no config.json to override)."""
    if path.is_dir():
        return ModelConfig.from_hf_folder(path, hf_overrides)
    if path.suffix == ".gguf":
        if hf_overrides:
            raise ConfigError(
                f"hf_overrides replaces keys of an HF folder's config.json; {path.name} is a "
                "GGUF file, whose metadata troupe reads as shipped"
            )
        return read_gguf_config(path)
    raise ModelLoadError(f"{path}: expected an HF model folder or a .gguf file")


def safetensors_files(folder: Path) -> list[Path]:
    """The safetensors shards of an HF folder (index file first, then the single file)."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"{index}: expected JSON with a 'weight_map' object") from exc
        files = [folder / name for name in sorted(set(weight_map.values()))]
        for file in files:
            if not file.is_file():
                raise ModelLoadError(f"{file}: listed in {INDEX_FILE} but missing")
        return files
    single = folder / SINGLE_FILE
    if single.is_file():
        return [single]
    raise ModelLoadError(
        f"{folder}: no {SINGLE_FILE} or {INDEX_FILE}; expected safetensors weights"
    )


def iter_hf_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor in the folder's safetensors files, one file at a time."""
    from safetensors import SafetensorError, safe_open

    for file in safetensors_files(folder):
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    yield name, handle.get_tensor(name)
        except SafetensorError as exc:
            raise ModelLoadError(f"{file}: not a readable safetensors file ({exc})") from exc


def load_model(
    path: Path,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int,
    kernel_backend: KernelBackend = "auto",
    quantization: Quantization = "auto",
    cpu_kernels: Q4Options = Q4Options(),
    hf_overrides: Mapping[str, Any] | None = None,
) -> tuple[ModelConfig, DecoderModel]:
    """Read the config (`hf_overrides` applied: read_config) and weights of `path` into a
    DecoderModel on `device`.

    quantization="keep" keeps a GGUF file's quantized matrices as shipped, and an HF folder's
    fp8 weights as fp8 and its GPTQ / AWQ 4-bit weights as int4 (gpu/quant_linear.py), 8-bit
    GPTQ as int8 where symmetric and in group order (gpu/gptq_int8.py; "keep" refuses others);
    "dequantize" expands every tensor to `dtype`;
    "auto" keeps them where troupe's kernels for them were measured faster than the expanded
    weights: on the CPU. On CUDA the kept int4 and fp8 matmuls lose to bf16 beyond one row
    (docs/benchmarks.md, "H200 figures, 2026-12-01"), so "auto" expands there until they win.
    `cpu_kernels`: whether kept 4-bit and Q8_0 CPU weights use the native kernels
    (gpu/cpu_q4lib.py). GPT-OSS's MXFP4 experts stay packed with "keep" alone: their Triton
    GEMMs (kernels/fused_moe_mxfp4.py) still lose to bf16's at decode, and past 16 rows an
    expert unpack them for bf16's anyway (docs/benchmarks.md, session 57); the CPU's reference
    unpacks them every step."""
    config = read_config(path, hf_overrides)
    if quantization != "keep":
        config = mxfp4_unpacked(config)
    keep = quantization == "keep" or (quantization == "auto" and device.type != "cuda")
    if path.suffix == ".gguf" and keep:
        model = DecoderModel(config, dtype, device, max_positions, kernel_backend)
        # before the one-thread section below: cpu_kernels.threads 0 means torch's count now
        q4 = load_q4(cpu_kernels) if device.type == "cpu" else None
        # hundreds of small byte shuffles (repacking): one thread, so no op waits at a barrier
        # for a second thread the OS has not scheduled (a shared machine); restored after
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            used = install_quantized(model, iter_gguf_quantized(path, config), q4)
            fill_weights(model, iter_gguf_tensors(path, config, frozenset(used)), str(path))
        finally:
            torch.set_num_threads(threads)
            forget_gguf_directories()
        return config, model.eval()
    reader = packed_reader(path, quantization == "keep") if path.is_dir() else None
    if reader is not None:  # GPTQ / AWQ / compressed-tensors int: kept as int4/int8, or expanded
        model = DecoderModel(config, dtype, device, max_positions, kernel_backend)
        q4 = load_q4(cpu_kernels) if keep and device.type == "cpu" else None
        with reader:
            kept = install_quantized(model, reader.modules(), q4) if keep else set()
            fill_weights(model, reader.dense(kept), str(path))
        return config, model.eval()
    if path.is_dir():
        fp8 = read_fp8_weights(safetensors_files(path))
        if fp8:  # shipped in fp8: kept as fp8 where a kernel runs it, else expanded
            model = DecoderModel(config, dtype, device, max_positions, kernel_backend)
            kept = install_quantized(model, fp8.items()) if keep else set()
            fill_weights(model, expand_fp8(iter_hf_tensors(path), fp8, kept), str(path))
            return config, model.eval()
    tensors = iter_gguf_tensors(path, config) if path.suffix == ".gguf" else iter_hf_tensors(path)
    try:
        model = build_model(
            config, tensors, dtype, device, max_positions, str(path), kernel_backend
        )
    finally:
        forget_gguf_directories()
    return config, model


def mxfp4_unpacked(config: ModelConfig) -> ModelConfig:
    """`config` with MXFP4 experts (GPT-OSS's files) unpacked at load instead of kept."""
    if config.moe is None or not config.moe.mxfp4:
        return config
    return dataclasses.replace(config, moe=dataclasses.replace(config.moe, mxfp4=False))


def packed_reader(folder: Path, strict: bool = False) -> PackedInt4Reader | CtReader | None:
    """The reader of a GPTQ / AWQ (gpu/gptq_awq_format.py) or integer compressed-tensors
    (gpu/ct_format.py) folder, GPTQ / AWQ tried first, None for any other (one device, tensor-
    parallel ranks and pipeline stages all choose here). `strict` (quantization "keep"): a
    linear the kept forms cannot hold is refused, not expanded."""
    packed = read_packed_int4_format(folder)
    if packed is not None:
        return PackedInt4Reader(safetensors_files(folder), packed, strict)
    ct = read_ct_format(folder)
    return None if ct is None else CtReader(safetensors_files(folder), ct, strict)


def build_model(
    config: ModelConfig,
    tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int,
    source: str = "weights",
    kernel_backend: KernelBackend = "auto",
) -> DecoderModel:
    """A DecoderModel with the given HF-named tensors loaded."""
    model = DecoderModel(config, dtype, device, max_positions, kernel_backend)
    fill_weights(model, tensors, source)
    return model.eval()


def random_weights(
    config: ModelConfig, dtype: torch.dtype, seed: int, std: float = 0.02
) -> dict[str, torch.Tensor]:
    """HF-named random weights (normal matrices, norms near 1): benchmarks and tests.

    Tests pass a larger `std` so tiny models have peaked logits (no near-ties in greedy).
    """
    gen = torch.Generator().manual_seed(seed)
    c = config

    def matrix(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(dtype)

    def norm(size: int) -> torch.Tensor:
        center = 0.0 if c.is_gemma else 1.0  # Gemma's norms scale by (1 + weight)
        return (center + 0.1 * torch.randn(size, generator=gen)).to(dtype)

    out = {
        "model.embed_tokens.weight": matrix(c.vocab_size, c.hidden_size),
        "model.norm.weight": norm(c.hidden_size),
    }
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = matrix(c.vocab_size, c.hidden_size)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm(c.hidden_size)
        out[p + "post_attention_layernorm.weight"] = norm(c.hidden_size)
        if c.mla is not None:  # DeepSeek: latent attention, shared experts
            from troupe.gpu.deepseek_weights import deepseek_layer_weights

            out.update(deepseek_layer_weights(c, i, matrix, norm))
            continue
        out[p + "self_attn.q_proj.weight"] = matrix(c.q_size, c.hidden_size)
        out[p + "self_attn.k_proj.weight"] = matrix(c.kv_size, c.hidden_size)
        out[p + "self_attn.v_proj.weight"] = matrix(c.kv_size, c.hidden_size)
        out[p + "self_attn.o_proj.weight"] = matrix(c.hidden_size, c.q_size)
        mlp = [("mlp.", c.intermediate_size)]
        if c.moe is not None and c.is_sparse(i):  # experts one by one, as checkpoints name them
            mlp = [(f"mlp.experts.{e}.", c.moe.intermediate_size) for e in range(c.moe.num_experts)]
            out[p + "mlp.gate.weight"] = matrix(c.moe.num_experts, c.hidden_size)
            if c.moe.gated_shared_size:  # Qwen2-MoE's shared expert and its gate
                mlp.append(("mlp.shared_expert.", c.moe.gated_shared_size))
                out[p + "mlp.shared_expert_gate.weight"] = matrix(1, c.hidden_size)
            if c.moe.plain_shared_size:  # HunYuan's MLP beside the experts
                mlp.append(("mlp.shared_mlp.", c.moe.plain_shared_size))
        for mp, inter in mlp:
            out[p + mp + "gate_proj.weight"] = matrix(inter, c.hidden_size)
            out[p + mp + "up_proj.weight"] = matrix(inter, c.hidden_size)
            out[p + mp + "down_proj.weight"] = matrix(c.hidden_size, inter)
        if c.qkv_bias:
            for name, size in (("q", c.q_size), ("k", c.kv_size), ("v", c.kv_size)):
                out[p + f"self_attn.{name}_proj.bias"] = matrix(size) * 5
        if c.o_bias:
            out[p + "self_attn.o_proj.bias"] = matrix(c.hidden_size)
        if c.mlp_bias and not c.is_sparse(i):
            out[p + "mlp.gate_proj.bias"] = matrix(c.intermediate_size)
            out[p + "mlp.up_proj.bias"] = matrix(c.intermediate_size)
            out[p + "mlp.down_proj.bias"] = matrix(c.hidden_size)
        if c.qk_norm:
            q_norm, k_norm = "q_norm", "k_norm"
            if c.model_type in HUNYUAN_TYPES:  # theirs, after the rotary (gpu/hunyuan_layer.py)
                q_norm, k_norm = "query_layernorm", "key_layernorm"
            out[p + f"self_attn.{q_norm}.weight"] = norm(c.head_dim)
            out[p + f"self_attn.{k_norm}.weight"] = norm(c.head_dim)
        if c.sandwich_norms:
            out[p + "pre_feedforward_layernorm.weight"] = norm(c.hidden_size)
            out[p + "post_feedforward_layernorm.weight"] = norm(c.hidden_size)
    return out


def qwen3_0_6b_config() -> ModelConfig:
    """The Qwen3-0.6B shape (benchmarks run it with random weights)."""
    return ModelConfig(
        model_type="qwen3",
        hidden_size=1024,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=3072,
        vocab_size=151936,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        qk_norm=True,
        max_position_embeddings=40960,
        eos_token_ids=(151645, 151643),
        torch_dtype=torch.bfloat16,
    )


def qwen3_tiny_config(vocab_size: int = 10_240) -> ModelConfig:
    """Qwen3-0.6B's shape cut to 2 layers of width 64 (smoke runs, CPU tests)."""
    return dataclasses.replace(
        qwen3_0_6b_config(),
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=vocab_size,
    )
