"""Shard-by-shard GGUF reads (gpu/tp_weights.py) on the default SmolLM2 file (Q4_1 and Q8_0
blocks): each slice a rank reads equals the same slice of the whole tensor as the one-rank
loader dequantizes it, llama.cpp's q/k row permutation undone per head."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from troupe.config import ConfigError, default_model_path
from troupe.gpu.gguf_weights import _dequantize, _read, read_gguf_config, unpermute_rotary
from troupe.gpu.tp_weights import GGUFShardReader


def _whole(name: str) -> torch.Tensor:
    path = default_model_path()
    info = next(i for i in _read(path)[1] if i.name == name)
    data = _dequantize(path, info)
    if name.endswith(("attn_q.weight", "attn_k.weight")):
        data = unpermute_rotary(data, data.shape[0] // 64)  # SmolLM2: head_dim 64
    return torch.from_numpy(np.ascontiguousarray(data))


CASES = [  # (GGUF name, HF name, dim, start, stop): rank 1 of 3 and an unaligned cut
    ("blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight", 0, 192, 384),
    ("blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight", 0, 64, 128),
    ("blk.1.attn_output.weight", "model.layers.1.self_attn.o_proj.weight", 1, 192, 384),
    ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight", 1, 512, 1024),
    ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight", 1, 10, 50),
    ("token_embd.weight", "model.embed_tokens.weight", 0, 16384, 32768),
    ("blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight", None, 0, 0),
]


def test_gguf_slices_equal_the_whole_tensor_sliced() -> None:
    try:
        path = default_model_path()
    except ConfigError:
        pytest.skip("the default model package is not installed")
    reader = GGUFShardReader(path, read_gguf_config(path))
    for gguf_name, name, dim, start, stop in CASES:
        whole = _whole(gguf_name)
        expected = whole if dim is None else whole.narrow(dim, start, stop - start)
        got = reader.read(name, dim, start, stop)
        assert torch.equal(got, expected), (name, dim, start, stop)
