"""LoRA adapters through the whole engine against PEFT on a tiny random Qwen3 (fp32, CPU):
two adapters of different ranks, targets and scaling (rslora) and the base model, greedy, all
at once in one batch and with fewer slots than adapters (the scheduler keeps a step's adapters
within max_loras; slots are refilled), on an overlapping runner; a prompt cached under one
adapter is not served to another; and what a broken adapter folder is told."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect
from troupe import Engine, EngineConfig
from troupe.config import ConfigError
from troupe.gpu.lora_runtime import install_lora
from troupe.gpu.model_runner import ModelRunner
from troupe.gpu.weights import load_model
from troupe.messages import Delta, Finished, Rejected, SamplingParams, StreamEvent

from tests.gpu.lora_reference import MAX_TOKENS, greedy, tokens_of
from tests.gpu.tiny_qwen3 import OVERLAPPING, cuda_config

PROMPTS = [[(13 * i + 5 * j + j * j) % 256 for j in range(7 + 5 * i)] for i in range(3)]


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
    }
    return EngineConfig(**(settings | changes))


def _run_all(config: EngineConfig, runner: ModelRunner | None) -> dict[str, list[int]]:
    """Every prompt under each adapter and the base model, all submitted at once."""
    results: dict[str, list[int]] = {}

    async def main() -> None:
        async with Engine.open(config, runner=runner) as engine:

            async def one(key: str, prompt: list[int], lora: str | None) -> None:
                params = SamplingParams(
                    max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, lora=lora
                )
                results[key] = tokens_of(await collect(engine, prompt, params))

            async with anyio.create_task_group() as tg:
                for i, prompt in enumerate(PROMPTS):
                    for lora in (None, "all", "qv"):
                        tg.start_soon(one, f"{lora}/{i}", prompt, lora)

    anyio.run(main)
    return results


def _expected(hf_model: Any, adapters: dict[str, Any]) -> dict[str, list[int]]:
    expected = {}
    for i, prompt in enumerate(PROMPTS):
        expected[f"None/{i}"] = greedy(hf_model, prompt)
        for name, peft_model in adapters.items():
            expected[f"{name}/{i}"] = greedy(peft_model, prompt)
    return expected


@pytest.mark.parametrize("max_loras", [2, 1])
def test_adapters_match_peft_in_one_batch(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path, max_loras: int
) -> None:
    folder, hf_model, adapters = lora_setup
    expected = _expected(hf_model, adapters)
    # the adapters change the text: a runner that ignored them would fail here
    assert expected["all/0"] != expected["None/0"] and expected["qv/0"] != expected["None/0"]
    config = _config(folder, tmp_path, max_loras=max_loras)
    assert _run_all(config, None) == expected


def test_overlapping_runner_and_slot_refills(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path
) -> None:
    """Decodes launched early and chunks merged into them keep each row's adapter; with one
    slot the adapters take turns in it (refilled as the steps need)."""
    folder, hf_model, adapters = lora_setup
    model_config, model = load_model(folder, torch.float32, torch.device("cpu"), 128)
    runtime = install_lora(
        model,
        model_config,
        {"all": str(tmp_path / "all"), "qv": str(tmp_path / "qv")},
        max_loras=1,
        max_rank=8,
        max_tokens=256,
    )
    runner = ModelRunner(model_config, model, OVERLAPPING)
    config = _config(folder, tmp_path, max_loras=1)
    assert _run_all(config, runner) == _expected(hf_model, adapters)
    assert runtime.num_loads >= 2  # both adapters went through the one slot
    assert runner.statistics().num_overlapped > 0


def test_prefix_cache_is_not_shared_across_adapters(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path
) -> None:
    """The same long prompt twice under the base model, then twice under adapter "all": the
    third must not reuse the base model's KV cached just before it (it would answer with the
    base model's prefix); each namespace hits its own. (Back to back: the CPU pool hands out
    cached blocks before untouched ones, so a cached prefix lasts one other request.)"""
    folder, hf_model, adapters = lora_setup
    prompt = [(7 * j + 3) % 256 for j in range(40)]
    got: list[tuple[list[int], int]] = []

    async def main() -> None:
        async with Engine.open(_config(folder, tmp_path)) as engine:
            for lora in (None, None, "all", "all"):
                params = SamplingParams(
                    max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, lora=lora
                )
                events = await collect(engine, prompt, params)
                last = events[-1]
                assert isinstance(last, Finished)
                got.append((tokens_of(events), last.usage.cached_tokens))

    anyio.run(main)
    base, tuned = greedy(hf_model, prompt), greedy(adapters["all"], prompt)
    assert [tokens for tokens, _ in got] == [base, base, tuned, tuned]
    cached = [n for _, n in got]
    assert cached[0] == 0 and cached[2] == 0  # nothing of the base model's served to "all"
    assert cached[1] > 0 and cached[3] > 0  # each hits its own


def test_unknown_adapter_is_rejected_by_name(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path
) -> None:
    folder, _, _ = lora_setup

    async def main() -> list[StreamEvent]:
        async with Engine.open(_config(folder, tmp_path)) as engine:
            return await collect(engine, PROMPTS[0], SamplingParams(lora="nope"))

    events = anyio.run(main)
    assert len(events) == 1 and isinstance(events[0], Rejected)
    assert events[0].field == "lora" and "'nope'" in events[0].message
    assert "all, qv" in events[0].message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"use_dora": True}, "DoRA is not supported"),
        ({"bias": "all"}, "bias 'all' is not supported"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"r": 8, "rank_too_big": True}, "rank 8 is over max_lora_rank = 4"),
    ],
)
def test_broken_adapters_are_refused_at_start(
    lora_setup: tuple[Path, Any, dict[str, Any]],
    tmp_path: Path,
    change: dict[str, Any],
    expected: str,
) -> None:
    folder, _, _ = lora_setup
    config_file = tmp_path / "all" / "adapter_config.json"
    settings = json.loads(config_file.read_text())
    rank_too_big = change.pop("rank_too_big", False)
    settings.update(change)
    config_file.write_text(json.dumps(settings))
    config = _config(folder, tmp_path, max_lora_rank=4 if rank_too_big else 8)

    async def main() -> None:
        async with Engine.open(config):
            pass

    with pytest.raises(ConfigError, match="adapter 'all'") as info:
        anyio.run(main)
    assert expected in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("max_loras", [2, 1])
def test_adapters_on_cuda_with_graphs_and_overlap(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path, max_loras: int
) -> None:
    """Decode graphs, mixed-step graphs (12-token steps) and overlapped decodes replay the
    slots' masks: each row still runs its own adapter (fp32, so greedy equals PEFT's)."""
    folder, hf_model, adapters = lora_setup
    config = cuda_config(folder).replace(
        lora_modules=(f"all={tmp_path / 'all'}", f"qv={tmp_path / 'qv'}"),
        max_lora_rank=8,
        max_loras=max_loras,
    )
    assert _run_all(config, None) == _expected(hf_model, adapters)


@pytest.mark.gpu
def test_base_requests_on_cuda_replay_the_off_form(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path
) -> None:
    """An engine serving adapters runs steps without any in the graphs' off form (captured
    beside the masked one, gpu/lora_runtime.graph_forms): the base model's tokens, after steps
    that held adapters in the slots."""
    folder, hf_model, adapters = lora_setup
    config = cuda_config(folder).replace(
        lora_modules=(f"all={tmp_path / 'all'}", f"qv={tmp_path / 'qv'}"), max_lora_rank=8
    )
    results: dict[str, list[int]] = {}

    async def main() -> None:
        async with Engine.open(config) as engine:
            for i, prompt in enumerate(PROMPTS):  # one at a time: adapter, then base alone
                for lora in ("all", None):
                    params = SamplingParams(
                        max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, lora=lora
                    )
                    results[f"{lora}/{i}"] = tokens_of(await collect(engine, prompt, params))

    anyio.run(main)
    expected = _expected(hf_model, adapters)
    assert results == {key: expected[key] for key in results}


@pytest.mark.parametrize(
    "changes",
    [
        {"num_kv_blocks": 24, "preemption_mode": "swap", "max_num_batched_tokens": 16},
        {"num_kv_blocks": 24, "preemption_mode": "recompute", "max_num_batched_tokens": 16},
        {
            "speculative_method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 1,
            "speculative_cost_model": False,
        },
    ],
    ids=["swap", "recompute", "ngram"],
)
def test_adapters_through_preemption_and_proposals(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path, changes: dict[str, Any]
) -> None:
    """A pool too small for the batch (requests swapped out or recomputed, then resumed on
    their adapter) and proposals verified through the adapter (several rows per sequence)."""
    folder, hf_model, adapters = lora_setup
    config = _config(folder, tmp_path, max_loras=2, **changes)
    assert _run_all(config, None) == _expected(hf_model, adapters)


def test_parallel_samples_keep_the_adapter(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path
) -> None:
    folder, _, adapters = lora_setup

    async def main() -> list[StreamEvent]:
        async with Engine.open(_config(folder, tmp_path)) as engine:
            params = SamplingParams(
                max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, lora="all", n=3
            )
            return await collect(engine, PROMPTS[1], params)

    events = anyio.run(main)
    samples: dict[int, list[int]] = {}
    for event in events:
        if isinstance(event, Delta | Finished):
            samples.setdefault(event.index, []).extend(event.token_ids)
    expected = greedy(adapters["all"], PROMPTS[1])
    assert samples == {0: expected, 1: expected, 2: expected}
