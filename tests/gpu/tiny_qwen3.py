"""A tiny random Qwen3 for engine tests against transformers (prompt logprobs, embeddings):
its folder with a word tokenizer, an overlapping CPU runner, and the configs the tests share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from troupe import EngineConfig
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.weights import load_model

from tests.gpu.conftest import add_word_tokenizer


def tiny_folder(hf_folder: Any, tmp_path: Path) -> tuple[Path, Any]:
    """(a loadable folder, the transformers model), from the `hf_folder` fixture."""
    model, hf_model = hf_folder("qwen3", max_position_embeddings=128)
    out = tmp_path / "model"
    out.mkdir()
    for file in Path(model).iterdir():
        (out / file.name).write_bytes(file.read_bytes())
    add_word_tokenizer(out)
    return out, hf_model


# A CPU runner's options that overlap steps (its decodes launch early, chunks can join them)
OVERLAPPING = RunnerOptions(
    block_size=4,
    num_gpu_blocks=96,
    num_cpu_blocks=8,
    max_num_seqs=8,
    max_model_len=128,
    overlap_schedule=True,
)


def overlapping_runner(folder: Path) -> ModelRunner:
    """A CPU runner that overlaps steps (OVERLAPPING)."""
    config, model = load_model(folder, torch.float32, torch.device("cpu"), 128)
    return ModelRunner(config, model, OVERLAPPING)


def recompute_config(folder: Path) -> EngineConfig:
    """A pool of 64 tokens: four requests of up to 28 tokens preempt (recompute)."""
    return EngineConfig(
        device="cpu",
        model=str(folder),
        dtype="float32",
        block_size=4,
        num_kv_blocks=16,
        max_num_seqs=4,
        max_num_batched_tokens=8,
        max_model_len=64,
        preemption_mode="recompute",
    )


def cuda_config(folder: Path) -> EngineConfig:
    """The same model on CUDA in fp32 (graphs and overlap on), prompts in 12-token chunks."""
    return EngineConfig(
        device="cuda",
        dtype="float32",
        model=str(folder),
        block_size=4,
        num_kv_blocks=96,
        max_model_len=128,
        max_num_seqs=8,
        max_num_batched_tokens=12,
    )
