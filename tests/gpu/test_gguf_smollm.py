"""The real default model (SmolLM2-135M, Q4_1 GGUF): greedy tokens identical to transformers
loading the same file (both dequantize to fp32)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from troupe.config import EngineConfig
from troupe.gpu.model_runner import ModelRunner

NUM_NEW = 32
PROMPTS = [
    [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 2, 198, 1, 4093, 198, 2683],
    [504, 3458, 282, 4649, 314],  # "The capital of France is"-like ids
    [28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48],
]


@pytest.fixture(scope="module")
def models(hf_smollm: Any) -> tuple[object, ModelRunner]:
    config = EngineConfig(
        device="cpu",
        dtype="auto",
        quantization="dequantize",  # fp32 as transformers runs it (token-identical)
        max_model_len=512,
        num_kv_blocks=64,
        num_cpu_blocks=8,
        max_num_seqs=4,
    )
    return hf_smollm, ModelRunner.from_config(config)  # model=None: the default GGUF


def test_config_from_gguf(models) -> None:
    _, runner = models
    assert runner.device.type == "cpu" and runner.model.dtype == torch.float32
    assert (runner.num_gpu_blocks, runner.num_cpu_blocks, runner.max_model_len) == (64, 8, 512)
    c = runner.model_config
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 9, 3, 64)
    assert (c.hidden_size, c.intermediate_size, c.vocab_size) == (576, 1536, 49152)
    assert c.tie_word_embeddings and c.rope_theta == 100000.0
    assert runner.eos_token_ids == (2,)


@pytest.mark.slow
def test_greedy_32_tokens_match_transformers(models, mt) -> None:
    hf_model, runner = models
    with torch.no_grad():
        expected = [
            hf_model.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=NUM_NEW,
                do_sample=False,
                pad_token_id=0,
            )[0, len(p) :].tolist()
            for p in PROMPTS
        ]
    driver = mt.PlanDriver(runner, chunk=8)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected
