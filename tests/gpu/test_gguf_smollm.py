"""The real default model (SmolLM2-135M, Q4_1 GGUF) read into a runner: its config and pool
sizes. (Its greedy tokens equal transformers' loading the same file, both dequantizing to
fp32: tests/gpu/test_engine_smollm.py, through the runner and the whole engine.)"""

from __future__ import annotations

import torch
from troupe.config import EngineConfig
from troupe.gpu.model_runner import ModelRunner


def test_config_from_gguf() -> None:
    config = EngineConfig(
        device="cpu",
        dtype="auto",
        quantization="dequantize",  # fp32 as transformers runs it (token-identical)
        max_model_len=512,
        num_kv_blocks=64,
        num_cpu_blocks=8,
        max_num_seqs=4,
    )
    runner = ModelRunner.from_config(config)  # model=None: the default GGUF
    assert runner.device.type == "cpu" and runner.model.dtype == torch.float32
    assert (runner.num_gpu_blocks, runner.num_cpu_blocks, runner.max_model_len) == (64, 8, 512)
    c = runner.model_config
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 9, 3, 64)
    assert (c.hidden_size, c.intermediate_size, c.vocab_size) == (576, 1536, 49152)
    assert c.tie_word_embeddings and c.rope_theta == 100000.0
    assert runner.eos_token_ids == (2,)
