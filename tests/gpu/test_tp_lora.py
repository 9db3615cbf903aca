"""LoRA adapters under tensor parallelism on the CPU (gloo, 2 worker processes): the rank cuts
add up to the whole adapter's delta (column-parallel: B's rows; row-parallel: A's columns,
summed as the all-reduce does); through the engine at tensor_parallel_size=2 a tiny Qwen3 (one
KV head, replicated) with two PEFT adapters and the base model in one batch generates PEFT's
greedy tokens, then one adapter alone (one slot) and the base alone (off); an adapter past
max_lora_rank is refused by name before any worker starts (run-time loads:
tests/gpu/test_tp_lora_runtime.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect
from troupe import Engine, EngineConfig
from troupe.config import ConfigError
from troupe.gpu.lora_adapter import load_adapter
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.runner import build_runner
from troupe.gpu.tp_lora import TPLoraSharding
from troupe.gpu.tp_model import TPShard
from troupe.gpu.tp_runner import TPRunner
from troupe.gpu.weights import read_config
from troupe.messages import SamplingParams

from tests.gpu.lora_reference import MAX_TOKENS, greedy, tokens_of

PROMPTS = [[(13 * i + 5 * j + j * j) % 256 for j in range(7 + 5 * i)] for i in range(2)]


def _config(folder: Path, tmp_path: Path, **changes: Any) -> EngineConfig:
    settings: dict[str, Any] = {
        "device": "cpu",
        "model": str(folder),
        "dtype": "float32",
        "block_size": 4,
        "num_kv_blocks": 96,
        "max_num_seqs": 8,
        "max_model_len": 128,
        "lora_modules": (f"all={tmp_path / 'all'}", f"qv={tmp_path / 'qv'}"),
        "max_lora_rank": 8,
        "tensor_parallel_size": 2,
    }
    return EngineConfig(**(settings | changes))


def test_rank_cuts_add_up_to_the_whole_delta(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path
) -> None:
    folder, _, _ = lora_setup
    full: ModelConfig = read_config(folder)
    adapter = load_adapter("all", str(tmp_path / "all"), full, 8)
    cuts = [TPLoraSharding(TPShard(rank=r, size=2, full=full)).shard(adapter) for r in (0, 1)]
    ranges = [TPLoraSharding(TPShard(rank=r, size=2, full=full)).ranges() for r in (0, 1)]
    torch.manual_seed(0)
    for (layer, module), (a, b) in adapter.weights.items():
        x = torch.randn(3, a.shape[1], dtype=torch.float64)
        whole = x @ a.double().t() @ b.double().t()
        parts = []
        for cut, rank_ranges in zip(cuts, ranges, strict=True):
            a_r, b_r = (t.double() for t in cut.weights[(layer, module)])
            dim, start, stop = rank_ranges[module]
            x_r = x if dim == 0 else x[:, start:stop]  # row-parallel: the rank's inputs
            parts.append((dim, start, stop, x_r @ a_r.t() @ b_r.t()))
        if parts[0][0] == 1:  # row-parallel: the all-reduce sums the ranks' deltas
            torch.testing.assert_close(parts[0][3] + parts[1][3], whole)
        else:  # column-parallel: each rank's output rows (KV rows may be the same on both)
            for _, start, stop, part in parts:
                torch.testing.assert_close(part, whole[:, start:stop])


def test_adapters_match_peft_with_two_ranks(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path
) -> None:
    folder, hf_model, adapters = lora_setup
    with pytest.raises(ConfigError, match=r"adapter 'all'.*rank 8 is over max_lora_rank = 4"):
        build_runner(_config(folder, tmp_path, max_lora_rank=4))  # before any spawn
    expected = {f"None/{i}": greedy(hf_model, p) for i, p in enumerate(PROMPTS)}
    for name, peft_model in adapters.items():
        expected |= {f"{name}/{i}": greedy(peft_model, p) for i, p in enumerate(PROMPTS)}
    assert expected["all/0"] != expected["None/0"] != expected["qv/0"]  # adapters matter
    config = _config(folder, tmp_path)
    runner = build_runner(config)
    assert isinstance(runner, TPRunner)
    results: dict[str, list[int]] = {}

    async def one(engine: Engine, key: str, prompt: list[int], lora: str | None) -> None:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, lora=lora)
        results[key] = tokens_of(await collect(engine, prompt, params))

    async def main() -> None:
        async with Engine.open(config, runner=runner) as engine:
            async with anyio.create_task_group() as tg:  # masked: several adapters per step
                for i, prompt in enumerate(PROMPTS):
                    for lora in (None, "all", "qv"):
                        tg.start_soon(one, engine, f"{lora}/{i}", prompt, lora)
            await one(engine, "alone/qv", PROMPTS[1], "qv")  # one slot: every token on "qv"
            await one(engine, "alone/None", PROMPTS[1], None)  # off: no adapter in the step

    anyio.run(main)
    assert results.pop("alone/qv") == expected["qv/1"]
    assert results.pop("alone/None") == expected["None/1"]
    assert results == expected
    assert None not in runner.worker_exit_codes()  # closed with the engine
