"""Sleep mode on the real runner (gpu/sleep_mode.py), tiny random Qwen3 folders on the CPU
against transformers: while asleep the weights' and the KV pool's storages hold no bytes; a
level-1 sleep wakes to the same greedy output; a level-2 sleep wakes to empty weights that
update_weights_from_disk or update_weights_from_tensors fill, after which the output is the new
checkpoint's; an update is refused while the weights sleep. On CUDA, sleep(1) with a LoRA
adapter and an EAGLE head, or kept 4-bit weights and a draft model, gives back all the device
memory they own (torch.cuda.memory_allocated() nearly 0) and wakes to the same tokens."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
import torch
from troupe import Engine, EngineConfig
from troupe.messages import SamplingParams
from troupe.messages.engine_calls import WeightsErrorCode
from troupe.messages.sleep_calls import SleepTag

from tests.gpu.conftest import add_word_tokenizer, write_random_model
from tests.gpu.eagle_heads import random_head
from tests.gpu.sleep_helpers import GreedyRuns, held_bytes, q4_gguf
from tests.lora.adapters import raw_adapter

PROMPT = [(7 * j + 3) % 256 for j in range(21)]
# on CUDA the steps replay graphs, captured again on waking (their old addresses are gone)
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]
MAX_TOKENS = 8


@pytest.fixture
def folders(tmp_path: Path, mt: SimpleNamespace) -> dict[str, tuple[Path, Any]]:
    """Qwen3 checkpoints A and B: same shapes, other weights."""
    made = {}
    for name, seed in (("a", 0), ("b", 1)):
        hf_model = mt.make_hf_model("qwen3", seed=seed)
        folder = tmp_path / name
        hf_model.save_pretrained(folder)
        add_word_tokenizer(folder)
        made[name] = folder, hf_model
    return made


def _config(folder: Path, device: str = "cpu") -> EngineConfig:
    return EngineConfig(
        device=device,  # type: ignore[arg-type]
        model=str(folder),
        dtype="float32",
        block_size=4,
        num_kv_blocks=64,
        max_num_seqs=4,
        max_model_len=128,
        enable_sleep_mode=True,
    )


async def _tokens(engine: Engine) -> list[int]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return [t async for e in engine.generate(PROMPT, params) for t in e.token_ids]


def test_the_runner_frees_and_restores_its_storages(
    folders: dict[str, tuple[Path, Any]], mt: SimpleNamespace
) -> None:
    (a, hf_a) = folders["a"]
    runner = mt.runner_for(a)
    qkv = runner.model.layers[0].qkv_proj
    before = qkv.detach().clone()
    pool_bytes = runner.kv.gpu.untyped_storage().nbytes()
    message = runner.sleeper.sleep(1)
    assert "level 1" in message and "copied to CPU memory" in message
    assert qkv.untyped_storage().nbytes() == 0 and runner.kv.gpu.untyped_storage().nbytes() == 0
    assert runner.model.embed_tokens.untyped_storage().nbytes() == 0
    assert runner.sleeper.sleeping == (SleepTag.WEIGHTS, SleepTag.KV_CACHE)
    runner.sleeper.wake_up((SleepTag.WEIGHTS,))
    assert torch.equal(runner.model.layers[0].qkv_proj, before)  # the same tensor, refilled
    runner.sleeper.wake_up((SleepTag.KV_CACHE,))
    assert runner.kv.gpu.untyped_storage().nbytes() == pool_bytes
    assert runner.kv.layers[0][0].untyped_storage().nbytes() == pool_bytes  # views follow
    assert runner.sleeper.sleeping == ()
    driver = mt.PlanDriver(runner)
    driver.add("r", PROMPT, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
    driver.run(MAX_TOKENS)
    assert driver.seqs["r"].output == mt.hf_greedy(hf_a, PROMPT, MAX_TOKENS)


@pytest.mark.parametrize("device", DEVICES)
def test_level_1_wakes_to_the_same_output(
    folders: dict[str, tuple[Path, Any]], mt: SimpleNamespace, device: str
) -> None:
    (a, hf_a) = folders["a"]
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with Engine.open(_config(a, device)) as engine:
            seen["before"] = await _tokens(engine)
            seen["sleep"] = await engine.sleep(1)
            seen["refused"] = await engine.update_weights_from_disk(str(a))
            seen["wake"] = await engine.wake_up()
            seen["after"] = await _tokens(engine)

    anyio.run(main)
    want = mt.hf_greedy(hf_a, PROMPT, MAX_TOKENS)
    assert seen["sleep"].success and seen["wake"].success, (seen["sleep"], seen["wake"])
    refused = seen["refused"]
    assert refused.error == WeightsErrorCode.UNSUPPORTED and "wake_up" in refused.message
    assert seen["before"] == seen["after"]
    if device == "cpu":  # fp32 on the CPU: transformers' own tokens
        assert seen["after"] == want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source", ["disk", "tensors"])
def test_level_2_wakes_to_weights_an_update_fills(
    folders: dict[str, tuple[Path, Any]], mt: SimpleNamespace, source: str, device: str
) -> None:
    (a, hf_a), (b, hf_b) = folders["a"], folders["b"]
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with Engine.open(_config(b, device)) as fresh:
            seen["fresh_b"] = await _tokens(fresh)
        async with Engine.open(_config(a, device)) as engine:
            seen["before"] = await _tokens(engine)
            assert (await engine.sleep(2)).success
            woke = await engine.wake_up(["weights"])
            assert woke.success and woke.sleeping == (SleepTag.KV_CACHE,), woke
            if source == "disk":
                seen["update"] = await engine.update_weights_from_disk(str(b))
            else:
                named = list(hf_b.state_dict().items())
                seen["partial"] = await engine.update_weights_from_tensors(named[:3])
                seen["update"] = await engine.update_weights_from_tensors(named)
            assert (await engine.wake_up(["kv_cache"])).success
            seen["after"] = await _tokens(engine)

    anyio.run(main)
    want_a, want_b = mt.hf_greedy(hf_a, PROMPT, MAX_TOKENS), mt.hf_greedy(hf_b, PROMPT, MAX_TOKENS)
    assert want_a != want_b
    assert seen["update"].success, seen["update"].message
    assert seen["after"] == seen["fresh_b"] != seen["before"]
    if device == "cpu":
        assert seen["before"] == want_a and seen["after"] == want_b
    if source == "tensors":
        partial = seen["partial"]
        assert partial.error == WeightsErrorCode.INVALID and "missing weights" in partial.message


# ~230 MiB of bf16 weights, an EAGLE head of ~90 MiB (its own embedding), a LoRA adapter
BIG = {
    "model_type": "qwen3",
    "hidden_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "intermediate_size": 2816,
    "vocab_size": 32000,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}
BIG_SHAPES = {
    "q_proj": (1024, 1024),
    "k_proj": (256, 1024),
    "v_proj": (256, 1024),
    "o_proj": (1024, 1024),
    "gate_proj": (2816, 1024),
    "up_proj": (2816, 1024),
    "down_proj": (1024, 2816),
}


def _cuda_runner(tmp_path: Path, kind: str) -> Any:
    settings: dict[str, Any] = {
        "device": "cuda",
        "dtype": "bfloat16",
        "block_size": 16,
        "num_kv_blocks": 64,
        "max_num_seqs": 4,
        "max_model_len": 128,
        "enable_sleep_mode": True,
        "num_speculative_tokens": 2,
    }
    if kind == "lora_eagle":
        target = write_random_model(tmp_path / "big", BIG, seed=0)
        adapter = raw_adapter(tmp_path / "ad", num_layers=4, shapes=BIG_SHAPES, scale=0.05)
        head = random_head(tmp_path / "head", target, embed=True)
        settings |= {"model": str(target), "lora_modules": (f"ad={adapter}",)}
        settings |= {"speculative_method": "eagle", "draft_model": str(head)}
    else:
        gguf = str(q4_gguf(tmp_path / "q4.gguf"))
        settings |= {"model": gguf, "speculative_method": "draft_model", "draft_model": gguf}
        settings |= {"quantization": "keep"}
    from troupe.gpu.model_runner import ModelRunner

    return ModelRunner.from_config(EngineConfig(**settings))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["lora_eagle", "q4_draft"])
def test_sleep_gives_back_all_the_device_memory_the_weights_own(tmp_path: Path, kind: str) -> None:
    runner = _cuda_runner(tmp_path, kind)
    run = GreedyRuns(runner)
    loras = [None, "ad"] if kind == "lora_eagle" else [None]
    before = [run(lora) for lora in loras]
    owned = sum(h.storage.nbytes() for h in runner.sleeper.parts())
    owned += runner.kv.gpu.untyped_storage().nbytes()
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()  # cuBLAS's own (32 MiB on Hopper), not the weights'
    allocated = torch.cuda.memory_allocated()
    runner.sleeper.sleep(1)
    torch._C._cuda_clearCublasWorkspaces()
    asleep = torch.cuda.memory_allocated()
    assert held_bytes(runner) == {}
    assert allocated - asleep >= owned, (allocated, asleep, owned)
    assert asleep <= 16 * 2**20, f"{asleep / 2**20:.1f} MiB still allocated"
    if kind == "lora_eagle":
        assert allocated >= 256 * 2**20, allocated
    runner.sleeper.wake_up((SleepTag.WEIGHTS, SleepTag.KV_CACHE))
    assert [run(lora) for lora in loras] == before
    runner.close()
