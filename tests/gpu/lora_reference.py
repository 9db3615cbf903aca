"""Shared by the LoRA engine tests: a tiny random Qwen3 with two PEFT adapters (the
`lora_setup` fixture, tests/gpu/conftest.py), and what transformers/PEFT generate greedily."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from troupe.messages import Delta, Finished, StreamEvent

from tests.gpu.tiny_qwen3 import tiny_folder
from tests.lora.adapters import peft_adapter

MAX_TOKENS = 12


def lora_models(hf_folder: Any, tmp_path: Path) -> tuple[Path, Any, dict[str, Any]]:
    """(model folder, transformers model, {adapter name: its PEFT model}); the adapters'
    folders are tmp_path / name: "all" (rank 8, every projection), "qv" (rank 4, q and v,
    rsLoRA)."""
    folder, hf_model = tiny_folder(hf_folder, tmp_path)
    adapters = {
        "all": peft_adapter(hf_model, tmp_path / "all", rank=8, alpha=16, seed=1),
        "qv": peft_adapter(
            hf_model,
            tmp_path / "qv",
            rank=4,
            alpha=8,
            targets=("q_proj", "v_proj"),
            seed=2,
            use_rslora=True,
            scale=0.4,
        ),
    }
    return folder, hf_model, adapters


def greedy(model: Any, prompt: list[int]) -> list[int]:
    """MAX_TOKENS greedy tokens of a transformers or PEFT model, EOS ignored."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return list(out[0, len(prompt) :].tolist())


def tokens_of(events: list[StreamEvent]) -> list[int]:
    """A finished request's tokens."""
    assert isinstance(events[-1], Finished), events[-1]
    return [t for e in events if isinstance(e, Delta | Finished) for t in e.token_ids]
