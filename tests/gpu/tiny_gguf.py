"""A tiny two-layer llama GGUF of random weights (norms near 1, matrices quantized), for the
tests that need a quantized checkpoint without a download (sleep mode, tensor-parallel
quantized shards)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def tiny_llama_gguf(path: Path, quant: str, *, intermediate_size: int, scale: float) -> Path:
    """Write the GGUF at `path` and return it: hidden 64, 4 heads, 2 KV heads, vocabulary 256;
    every matrix in the gguf quant type named `quant` ("Q4_0", "Q8_0", ...), its values
    standard normal times `scale` (seeded: the same file every call)."""
    import gguf

    quant_type = gguf.GGMLQuantizationType[quant]
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in {
        "context_length": 128,
        "embedding_length": 64,
        "block_count": 2,
        "feed_forward_length": intermediate_size,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "vocab_size": 256,
    }.items():
        writer.add_uint32(f"llama.{key}", value)
    gen = np.random.default_rng(0)
    ffn = intermediate_size
    shapes = {"token_embd.weight": (256, 64), "output_norm.weight": (64,)}
    for i in range(2):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (64,),
            f"blk.{i}.ffn_norm.weight": (64,),
            f"blk.{i}.attn_q.weight": (64, 64),
            f"blk.{i}.attn_k.weight": (32, 64),
            f"blk.{i}.attn_v.weight": (32, 64),
            f"blk.{i}.attn_output.weight": (64, 64),
            f"blk.{i}.ffn_gate.weight": (ffn, 64),
            f"blk.{i}.ffn_up.weight": (ffn, 64),
            f"blk.{i}.ffn_down.weight": (64, ffn),
        }
    for name, shape in shapes.items():
        data = gen.standard_normal(shape).astype(np.float32) * scale
        if len(shape) == 1:
            writer.add_tensor(name, 1 + data)
        else:
            packed = gguf.quants.quantize(data, quant_type)
            writer.add_tensor(name, packed, raw_dtype=quant_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
