"""LoRA adapters loaded and unloaded while the engine runs (engine.loras; vLLM's
load_lora_adapter), on a tiny random Qwen3 against PEFT: an adapter loaded after start-up
runs as PEFT does; one in use cannot be unloaded; an unloaded name is refused; a name loaded
again with other weights runs the new ones, not KV that the prefix cache holds from the old."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from troupe import Engine, EngineConfig
from troupe.actors.lora_registry import LoraAdapterError
from troupe.config import ConfigError
from troupe.messages import Finished, Rejected, SamplingParams, StreamEvent

from tests.gpu.lora_reference import MAX_TOKENS, greedy, tokens_of

PROMPT = [(11 * j + 2) % 256 for j in range(30)]


def _config(folder: Path) -> EngineConfig:
    return EngineConfig(
        device="cpu",
        model=str(folder),
        dtype="float32",
        block_size=4,
        num_kv_blocks=96,
        max_num_seqs=8,
        max_model_len=128,
        enable_lora=True,
        max_lora_rank=8,
        max_loras=2,
    )


def _params(lora: str | None) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, lora=lora)


def test_load_run_unload_and_load_again(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path
) -> None:
    folder, hf_model, adapters = lora_setup
    seen: list[Any] = []

    async def main() -> None:
        async with Engine.open(_config(folder)) as engine:

            async def run(lora: str | None) -> list[StreamEvent]:
                return [e async for e in engine.generate(PROMPT, _params(lora))]

            seen.append(await run("tuned"))  # not loaded yet
            await engine.loras.load("tuned", str(tmp_path / "all"))
            assert engine.lora_adapters == {"tuned": str(tmp_path / "all")}
            seen.append(await run("tuned"))
            seen.append(await run(None))
            # in flight: the unload is refused, the request still ends as it should
            events = engine.generate(PROMPT, _params("tuned"))
            first = await events.__anext__()
            with pytest.raises(LoraAdapterError, match="1 requests in flight"):
                await engine.loras.unload("tuned")
            seen.append([first] + [e async for e in events])
            await engine.loras.unload("tuned")
            assert engine.lora_adapters == {}
            seen.append(await run("tuned"))  # unloaded: refused
            # the same name, other weights: the prompt's cached KV of the old ones is not used
            await engine.loras.load("tuned", str(tmp_path / "qv"))
            seen.append(await run("tuned"))

    anyio.run(main)
    refused_before, tuned, base, in_flight, refused_after, reloaded = seen
    for refused in (refused_before, refused_after):
        assert len(refused) == 1 and isinstance(refused[0], Rejected)
        assert refused[0].field == "lora"
    assert tokens_of(tuned) == tokens_of(in_flight) == greedy(adapters["all"], PROMPT)
    assert tokens_of(base) == greedy(hf_model, PROMPT)
    assert tokens_of(reloaded) == greedy(adapters["qv"], PROMPT)
    last = reloaded[-1]
    assert isinstance(last, Finished) and last.usage.cached_tokens == 0


def test_loads_that_cannot_be_done(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path
) -> None:
    folder, _, _ = lora_setup

    async def main() -> None:
        async with Engine.open(_config(folder)) as engine:
            with pytest.raises(ConfigError, match=r"adapter 'x'.*no adapter_config.json"):
                await engine.loras.load("x", str(tmp_path / "missing"))
            assert engine.lora_adapters == {}  # a failed load leaves nothing behind
            with pytest.raises(LoraAdapterError, match="must be 1-128 characters") as bad:
                await engine.loras.load("a#b", str(tmp_path / "all"))
            assert bad.value.field == "lora_name"
            await engine.loras.load("x", str(tmp_path / "all"))
            with pytest.raises(LoraAdapterError, match="already loaded"):
                await engine.loras.load("x", str(tmp_path / "qv"))
            with pytest.raises(LoraAdapterError, match="no LoRA adapter named 'y'"):
                await engine.loras.unload("y")
        off = _config(folder).replace(enable_lora=False)
        async with Engine.open(off) as engine:
            with pytest.raises(LoraAdapterError, match="enable_lora"):
                await engine.loras.load("x", str(tmp_path / "all"))

    anyio.run(main)
