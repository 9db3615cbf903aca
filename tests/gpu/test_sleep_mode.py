"""Sleep mode on the real runner (gpu/sleep_mode.py), tiny random Qwen3 folders on the CPU
against transformers: while asleep the weights' and the KV pool's storages hold no bytes; a
level-1 sleep wakes to the same greedy output; a level-2 sleep wakes to empty weights that
update_weights_from_disk or update_weights_from_tensors fill, after which the output is the new
checkpoint's; an update is refused while the weights sleep."""

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

from tests.gpu.conftest import add_word_tokenizer

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
