"""Prompt logprobs (SamplingParams.prompt_logprobs) through the whole engine on a tiny random
Qwen3 against transformers: chunked prompts (the scheduler names the token after each chunk),
beside decoding requests on an overlapping runner (a scored chunk is never folded into an
overlapped step), a repeated prompt that would hit the prefix cache (it is computed whole),
and parallel samples (each sample's first event carries the prompt's logprobs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, wait_blocks_free
from troupe import Engine, EngineConfig
from troupe.gpu.model_runner import ModelRunner
from troupe.messages import Delta, Finished, Rejected, SamplingParams, StreamEvent, TokenLogprob

from tests.gpu.tiny_qwen3 import cuda_config, overlapping_runner, recompute_config, tiny_folder

PROMPTS = [[(11 * i + 7 * j + j * j) % 256 for j in range(9 + 6 * i)] for i in range(4)]


@pytest.fixture
def tiny(hf_folder: Any, tmp_path: Path) -> tuple[Path, Any]:
    return tiny_folder(hf_folder, tmp_path)


def _expected(hf_model: Any, prompt: list[int], top_n: int) -> list[tuple[float, list[int], int]]:
    with torch.no_grad():
        logprobs = hf_model(torch.tensor([prompt])).logits[0, :-1].log_softmax(-1)
    chosen = logprobs.gather(1, torch.tensor(prompt[1:])[:, None])
    top = logprobs.topk(top_n, dim=-1).indices if top_n else logprobs[:, :0].long()
    ranks = (logprobs >= chosen).sum(dim=-1)  # not near a tie in these random prompts
    return [(chosen[i, 0].item(), top[i].tolist(), int(ranks[i])) for i in range(len(prompt) - 1)]


def _check(
    got: tuple[TokenLogprob, ...] | None, hf_model: Any, prompt: list[int], k: int, tol: float
) -> None:
    assert got is not None
    expected = _expected(hf_model, prompt, k)
    assert [e.token_id for e in got] == prompt[1:]
    assert len(got) == len(expected)
    for entry, (logprob, top, rank) in zip(got, expected, strict=True):
        assert entry.logprob == pytest.approx(logprob, abs=tol)
        assert [t for t, _ in entry.top] == top
        assert entry.rank == rank


def _first(events: list[StreamEvent]) -> Delta | Finished:
    first = events[0]
    assert isinstance(first, Delta | Finished)
    later = [e for e in events[1:] if isinstance(e, Delta | Finished)]
    assert all(e.prompt_logprobs is None for e in later)  # only a request's first event
    return first


def _workload(config: EngineConfig, runner: ModelRunner | None) -> dict[str, list[StreamEvent]]:
    """Scored prompts beside decoding neighbours, a repeat of one, parallel samples of one."""
    results: dict[str, list[StreamEvent]] = {}

    async def main() -> None:
        async with Engine.open(config, runner=runner) as engine:

            async def one(name: str, prompt: list[int], params: SamplingParams) -> None:
                results[name] = await collect(engine, prompt, params)

            decode = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
            async with anyio.create_task_group() as tg:
                for i, prompt in enumerate(PROMPTS):  # decoding neighbours: mixed steps
                    tg.start_soon(one, f"plain{i}", prompt[::-1], decode)
                for i, prompt in enumerate(PROMPTS):
                    params = SamplingParams(
                        max_tokens=3, temperature=0.0, prompt_logprobs=i % 3, logprobs=1
                    )
                    tg.start_soon(one, f"scored{i}", prompt, params)
            # the same prompt again, cached now: it is still scored whole
            again = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=2)
            results["again"] = await collect(engine, PROMPTS[3], again)
            samples = SamplingParams(max_tokens=2, temperature=1.0, n=2, seed=3, prompt_logprobs=0)
            results["samples"] = await collect(engine, PROMPTS[1], samples)
            await wait_blocks_free(engine, timeout=60)

    anyio.run(main)
    return results


def _check_workload(results: dict[str, list[StreamEvent]], hf_model: Any, tol: float) -> None:
    for i, prompt in enumerate(PROMPTS):
        events = results[f"scored{i}"]
        assert isinstance(terminal(events), Finished)
        _check(_first(events).prompt_logprobs, hf_model, prompt, i % 3, tol)
        assert _first(results[f"plain{i}"]).prompt_logprobs is None
    _check(_first(results["again"]).prompt_logprobs, hf_model, PROMPTS[3], 2, tol)
    firsts: dict[int, Delta | Finished] = {}
    for event in results["samples"]:
        if isinstance(event, Delta | Finished) and event.index not in firsts:
            firsts[event.index] = event
    assert sorted(firsts) == [0, 1]
    for event in firsts.values():
        _check(event.prompt_logprobs, hf_model, PROMPTS[1], 0, tol)


def test_prompt_logprobs_equal_transformers(tiny: tuple[Path, Any]) -> None:
    folder, hf_model = tiny
    config = EngineConfig(
        device="cpu",
        model=str(folder),
        max_model_len=128,
        max_num_seqs=8,
        max_num_batched_tokens=12,  # prompts of 9-27 tokens come in chunks
        enable_prefix_caching=True,
    )
    _check_workload(_workload(config, overlapping_runner(folder)), hf_model, 1e-4)


@pytest.mark.gpu
def test_prompt_logprobs_on_cuda_with_graphs_and_overlap(tiny: tuple[Path, Any]) -> None:
    folder, hf_model = tiny
    config = cuda_config(folder)
    _check_workload(_workload(config, None), hf_model, 2e-3)


def test_prompt_logprobs_out_of_range_is_rejected(tiny: tuple[Path, Any]) -> None:
    folder, _ = tiny
    config = EngineConfig(device="cpu", model=str(folder), max_model_len=128, max_num_seqs=4)

    async def main() -> list[StreamEvent]:
        async with Engine.open(config, runner=overlapping_runner(folder)) as engine:
            return await collect(engine, PROMPTS[0], SamplingParams(prompt_logprobs=21))

    event = terminal(anyio.run(main))
    assert isinstance(event, Rejected)
    assert event.field == "prompt_logprobs" and "[0, 20]" in event.message


def test_prompt_logprobs_survive_recompute_preemption(tiny: tuple[Path, Any]) -> None:
    folder, hf_model = tiny
    config = recompute_config(folder)
    prompts = [p[:16] for p in PROMPTS]
    results: dict[int, list[StreamEvent]] = {}

    async def main() -> int:
        async with Engine.open(config) as engine:

            async def one(i: int) -> None:
                params = SamplingParams(
                    max_tokens=12, temperature=0.0, ignore_eos=True, prompt_logprobs=1
                )
                results[i] = await collect(engine, prompts[i], params)

            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            await wait_blocks_free(engine, timeout=60)
            return engine.stats().num_preemptions_recompute

    assert anyio.run(main) > 0
    for i, prompt in enumerate(prompts):
        assert isinstance(terminal(results[i]), Finished)
        _check(_first(results[i]).prompt_logprobs, hf_model, prompt, 1, 1e-4)
