"""Sleep mode frees everything the weights own (gpu/sleep_parts.py), on CPU runners of tiny
random models: a Qwen3 with a LoRA adapter and an EAGLE head (its own embedding), and a 4-bit
GGUF llama with a draft model. After sleep(1) no tensor reachable from the runner holds a byte
(found by walking every object the runner reaches, so a tensor someone adds later is caught);
waking gives the same greedy tokens, with and without the adapter, and the same proposals. A
level-2 sleep keeps the adapters and the head, and the weights a reload refills (poisoned
first) give the same tokens; over kept-quantized weights it is refused, nothing freed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from troupe import EngineConfig
from troupe.gpu.model_runner import ModelRunner
from troupe.gpu.sleep_parts import Role
from troupe.gpu.sleep_state import SleepRefused
from troupe.messages.sleep_calls import ALL_TAGS, SleepTag

from tests.gpu.conftest import FAMILIES, TINY, write_random_model
from tests.gpu.eagle_heads import random_head
from tests.gpu.mtp_checkpoints import save_model
from tests.gpu.sleep_helpers import GreedyRuns, held_bytes, q4_gguf
from tests.lora.adapters import raw_adapter

QWEN3 = {**TINY, **FAMILIES["qwen3"], "model_type": "qwen3", "max_position_embeddings": 128}
SHAPES = {  # QWEN3's projections (out, in): 4 heads of 32, one KV head, MLP 128
    "q_proj": (128, 64),
    "k_proj": (32, 64),
    "v_proj": (32, 64),
    "o_proj": (64, 128),
    "gate_proj": (128, 64),
    "up_proj": (128, 64),
    "down_proj": (64, 128),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sleep_everything")
    target = write_random_model(root / "qwen3", QWEN3, seed=0)
    return {
        "qwen3": target,
        "adapter": raw_adapter(root / "adapter", num_layers=2, shapes=SHAPES, scale=0.2),
        "head": random_head(root / "head", target, embed=True),
        "gguf": q4_gguf(root / "q4.gguf"),
        "mtp": save_model(root / "mtp"),  # DeepSeek-V3 (MLA, experts) with its MTP layer
    }


def _runner(folders: dict[str, Path], kind: str, **extra: Any) -> ModelRunner:
    settings: dict[str, Any] = {
        "device": "cpu",
        "dtype": "float32",
        "block_size": 4,
        "num_kv_blocks": 32,
        "max_num_seqs": 4,
        "max_model_len": 64,
        "enable_sleep_mode": True,
        "num_speculative_tokens": 2,
    }
    if kind == "lora_eagle":
        settings |= {
            "model": str(folders["qwen3"]),
            "lora_modules": (f"ad={folders['adapter']}",),
            "speculative_method": "eagle",
            "draft_model": str(folders["head"]),
        }
    elif kind == "mtp":
        settings |= {"model": str(folders["mtp"]), "speculative_method": "mtp"}
    else:  # the draft model is the target itself, loaded again (kept 4-bit too)
        gguf = str(folders["gguf"])
        settings |= {"model": gguf, "speculative_method": "draft_model", "draft_model": gguf}
        settings |= {"quantization": "keep", "cpu_native_kernels": kind == "q4_native_draft"}
    return ModelRunner.from_config(EngineConfig(**(settings | extra)))


# q4_native_draft: the native CPU 4-bit kernel's layout (gpu/cpu_q4.py) where it builds here,
# else torch's packed form as q4_draft
@pytest.mark.parametrize("kind", ["lora_eagle", "q4_draft", "q4_native_draft", "mtp"])
def test_level_1_frees_every_tensor_and_wakes_to_the_same_tokens(
    folders: dict[str, Path], kind: str
) -> None:
    runner = _runner(folders, kind)
    run = GreedyRuns(runner, num_tokens=3 if kind == "mtp" else 6)  # experts: slow on the CPU
    loras = [None, "ad"] if kind == "lora_eagle" else [None]
    before = [run(lora) for lora in loras]
    assert all(any(p) for _, p in before), "the draft proposes"
    roles = {h.role for h in runner.sleeper.parts()}
    heads = ("lora_eagle", "mtp")  # they read the model's hidden rows (ZEROED)
    assert roles == ({Role.WEIGHTS, Role.KEPT} | ({Role.ZEROED} if kind in heads else set()))
    held = held_bytes(runner)
    assert any(".kv." in k for k in held) and any("draft" in k for k in held), sorted(held)
    message = runner.sleeper.sleep(1)
    assert "copied to CPU memory" in message
    assert held_bytes(runner) == {}
    runner.sleeper.wake_up((SleepTag.WEIGHTS,))
    runner.sleeper.wake_up((SleepTag.KV_CACHE,))
    assert [run(lora) for lora in loras] == before
    assert held_bytes(runner) == held  # all of it back (scratch made again on first use)
    if kind == "lora_eagle":
        assert before[0][0] != before[1][0], "the adapter changes the tokens"


@pytest.mark.parametrize("kind", ["lora_eagle", "q4_draft"])
def test_closing_frees_every_tensor_without_sleep_mode(folders: dict[str, Path], kind: str) -> None:
    """ModelRunner.close gives everything back even while something still references the
    runner (a second engine in the process sizes its pool from what is free)."""
    runner = _runner(folders, kind, enable_sleep_mode=False)
    GreedyRuns(runner)()
    assert any(".kv." in k for k in held_bytes(runner))
    runner.close()
    assert held_bytes(runner) == {}


def test_level_2_reload_refills_the_weights_adapters_and_head_kept(
    folders: dict[str, Path],
) -> None:
    runner = _runner(folders, "lora_eagle", lora_kernel="punica")  # its tables sleep too
    run = GreedyRuns(runner)
    before = [run(None), run("ad")]
    assert "discarded" in runner.sleeper.sleep(2)
    assert held_bytes(runner) == {}
    runner.sleeper.wake_up(ALL_TAGS)
    for held in runner.sleeper.parts():  # what a reload must refill: poisoned
        if held.role is Role.WEIGHTS:
            torch.empty(0, dtype=torch.uint8).set_(held.storage).fill_(0xFF)
    assert "copied" in runner.weights.from_disk(str(folders["qwen3"]))
    assert [run(None), run("ad")] == before


def test_level_2_over_kept_quantized_weights_is_refused_nothing_freed(
    folders: dict[str, Path],
) -> None:
    runner = _runner(folders, "q4_draft")
    held = held_bytes(runner)
    with pytest.raises(
        SleepRefused, match=r"level 2 .* 9 served weights are kept quantized \(embed_tokens, layers"
    ):
        runner.sleeper.sleep(2)
    assert held_bytes(runner) == held and runner.sleeper.sleeping == ()
