"""Per-token pooling (vLLM's token_classify and token_embed) through the whole engine against
transformers on tiny random checkpoints: a `*ForTokenClassification` model's per-token
probabilities and logits (its head's bias included), a `*ForSequenceClassification` model's
score head on every token, a causal LM's every final hidden state (unit norm or raw); prompts
in chunks of a small max_num_batched_tokens beside each other; a prompt whose blocks the prefix
cache holds computed whole all the same; under recompute preemption; the tasks a model lacks
refused by field; every KV block back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, wait_blocks_free
from troupe import Engine, EngineConfig
from troupe.messages import Finished, Pooling, Rejected, SamplingParams, StreamEvent

from tests.gpu.tiny_classifier import LABELS, hf_hidden, hf_logits, tiny_classifier
from tests.gpu.tiny_qwen3 import recompute_config, tiny_folder

PROMPTS = [[(13 * i + 5 * j + j * j) % 256 for j in range(3 + 9 * i)] for i in range(4)]


def _params(task: str, normalize: bool = True, max_tokens: int = 1) -> SamplingParams:
    pooling = Pooling(task=task, normalize=normalize)  # type: ignore[arg-type]
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, pooling=pooling)


def _config(folder: Path) -> EngineConfig:
    return EngineConfig(
        device="cpu",
        model=str(folder),
        max_model_len=128,
        max_num_seqs=8,
        max_num_batched_tokens=12,  # prompts of 3-30 tokens come in chunks, several a step
        enable_prefix_caching=True,
    )


def _rows(events: list[StreamEvent], num_rows: int) -> torch.Tensor:
    """The request's per-token vector as [num_rows, width]."""
    end = terminal(events)
    assert isinstance(end, Finished), events
    assert end.usage.prompt_tokens == num_rows
    first = events[0]
    assert isinstance(first, Finished) or first.embedding is not None
    assert first.embedding is not None
    assert len(first.embedding) % num_rows == 0
    return torch.tensor(first.embedding).view(num_rows, -1)


async def _run_all(
    engine: Engine, requests: dict[str, tuple[list[int], SamplingParams]]
) -> dict[str, list[StreamEvent]]:
    """Every request at once; the events of each by name."""
    results: dict[str, list[StreamEvent]] = {}

    async def one(name: str, prompt: list[int], params: SamplingParams) -> None:
        results[name] = await collect(engine, prompt, params)

    async with anyio.create_task_group() as tg:
        for name, (prompt, params) in requests.items():
            tg.start_soon(one, name, prompt, params)
    return results


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_token_classify_equals_transformers(tmp_path: Path, family: str) -> None:
    hf_model = tiny_classifier(tmp_path / "tok", family, per_token=True)
    requests = {f"probs{i}": (p, _params("token_classify")) for i, p in enumerate(PROMPTS)}
    requests |= {f"logits{i}": (p, _params("token_classify", False)) for i, p in enumerate(PROMPTS)}
    results: dict[str, list[StreamEvent]] = {}

    async def main() -> None:
        async with Engine.open(_config(tmp_path / "tok")) as engine:
            assert engine.classifier_labels == tuple(LABELS.values())
            assert engine.is_token_classifier
            results.update(await _run_all(engine, requests))
            # its blocks are cached now: the prompt is computed whole all the same
            results["again"] = await collect(engine, PROMPTS[3], _params("token_classify"))
            await wait_blocks_free(engine, timeout=60)

    anyio.run(main)
    for i, prompt in enumerate(PROMPTS):
        want = hf_logits(hf_model, prompt)
        assert want.shape == (len(prompt), len(LABELS))
        assert _rows(results[f"logits{i}"], len(prompt)) == pytest.approx(want, abs=1e-4)
        probs = _rows(results[f"probs{i}"], len(prompt))
        assert probs == pytest.approx(torch.softmax(want, dim=-1), abs=1e-5)
    again = terminal(results["again"])
    assert isinstance(again, Finished) and again.usage.cached_tokens == 0
    want = torch.softmax(hf_logits(hf_model, PROMPTS[3]), dim=-1)
    assert _rows(results["again"], len(PROMPTS[3])) == pytest.approx(want, abs=1e-5)
    # the rows differ from each other: the test tells positions apart
    assert not torch.allclose(want[0], want[-1], atol=1e-3)


def test_a_sequence_classifier_scores_every_token(tmp_path: Path) -> None:
    hf_model = tiny_classifier(tmp_path / "seq", "qwen3", seed=2)
    prompt = PROMPTS[2]
    results: dict[str, list[StreamEvent]] = {}

    async def main() -> None:
        async with Engine.open(_config(tmp_path / "seq")) as engine:
            assert not engine.is_token_classifier
            classify = SamplingParams(
                max_tokens=1, temperature=0.0, pooling=Pooling(task="classify")
            )
            results["classify"] = await collect(engine, prompt, classify)  # caches the blocks
            results["tokens"] = await collect(engine, prompt, _params("token_classify", False))
            await wait_blocks_free(engine, timeout=60)

    anyio.run(main)
    with torch.no_grad():
        want = hf_model.score(hf_hidden(hf_model, prompt))
    got = _rows(results["tokens"], len(prompt))
    assert got == pytest.approx(want, abs=1e-4)
    assert got[-1] == pytest.approx(hf_logits(hf_model, prompt), abs=1e-4)  # classify's row
    tokens = terminal(results["tokens"])
    assert isinstance(tokens, Finished) and tokens.usage.cached_tokens == 0


def test_token_embed_equals_transformers(tmp_path: Path, hf_folder: Any) -> None:
    folder, hf_model = tiny_folder(hf_folder, tmp_path)
    requests = {f"unit{i}": (p, _params("token_embed")) for i, p in enumerate(PROMPTS)}
    requests |= {f"raw{i}": (p, _params("token_embed", False, 3)) for i, p in enumerate(PROMPTS)}
    plain = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    requests |= {f"plain{i}": (p[::-1], plain) for i, p in enumerate(PROMPTS)}
    results: dict[str, list[StreamEvent]] = {}

    async def main() -> None:
        async with Engine.open(_config(folder)) as engine:
            results.update(await _run_all(engine, requests))
            last = SamplingParams(max_tokens=1, pooling=Pooling())
            await collect(engine, PROMPTS[3], last)  # a last-token embedding keeps its hit
            results["last"] = await collect(engine, PROMPTS[3], last)
            results["again"] = await collect(engine, PROMPTS[3], _params("token_embed"))
            await wait_blocks_free(engine, timeout=60)

    anyio.run(main)
    for i, prompt in enumerate(PROMPTS):
        hidden = hf_hidden(hf_model, prompt)
        assert _rows(results[f"raw{i}"], len(prompt)) == pytest.approx(hidden, abs=1e-4)
        unit = torch.nn.functional.normalize(hidden, dim=-1)
        assert _rows(results[f"unit{i}"], len(prompt)) == pytest.approx(unit, abs=1e-5)
        assert all(e.embedding is None for e in results[f"plain{i}"])
    cached = terminal(results["last"])
    assert isinstance(cached, Finished) and cached.usage.cached_tokens > 0  # blocks are cached
    again = terminal(results["again"])
    assert isinstance(again, Finished) and again.usage.cached_tokens == 0
    unit = torch.nn.functional.normalize(hf_hidden(hf_model, PROMPTS[3]), dim=-1)
    assert _rows(results["again"], len(PROMPTS[3])) == pytest.approx(unit, abs=1e-5)


def test_token_embed_survives_recompute_preemption(tmp_path: Path, hf_folder: Any) -> None:
    folder, hf_model = tiny_folder(hf_folder, tmp_path)
    prompts = [[(7 * i + 3 * j) % 256 for j in range(16)] for i in range(4)]
    params = SamplingParams(max_tokens=12, ignore_eos=True, pooling=Pooling(task="token_embed"))
    results: dict[str, list[StreamEvent]] = {}

    async def main() -> int:
        async with Engine.open(recompute_config(folder)) as engine:
            requests = {str(i): (p, params) for i, p in enumerate(prompts)}
            results.update(await _run_all(engine, requests))
            await wait_blocks_free(engine, timeout=60)
            return engine.stats().num_preemptions_recompute

    assert anyio.run(main) > 0
    for i, prompt in enumerate(prompts):
        unit = torch.nn.functional.normalize(hf_hidden(hf_model, prompt), dim=-1)
        assert _rows(results[str(i)], len(prompt)) == pytest.approx(unit, abs=1e-5)


def test_tasks_a_model_lacks_are_refused_by_field(tmp_path: Path, hf_folder: Any) -> None:
    tiny_classifier(tmp_path / "tok", "qwen3", per_token=True)
    tiny_classifier(tmp_path / "seq", "qwen3")
    lm_folder, _ = tiny_folder(hf_folder, tmp_path)
    asked = {
        "tok": {
            "generate": (SamplingParams(max_tokens=4), "model"),
            "embed": (_params("embed"), "model"),
            "token_embed": (_params("token_embed"), "model"),
            "classify": (_params("classify"), "pooling"),
            "two": (_params("token_classify", max_tokens=2), "max_tokens"),
        },
        "seq": {"token_embed": (_params("token_embed"), "model")},
        "lm": {"token_classify": (_params("token_classify"), "pooling")},
    }
    folders = {"tok": tmp_path / "tok", "seq": tmp_path / "seq", "lm": lm_folder}
    refusals: dict[tuple[str, str], StreamEvent] = {}

    async def main() -> None:
        for model, cases in asked.items():
            async with Engine.open(_config(folders[model])) as engine:
                for name, (params, _) in cases.items():
                    refusals[model, name] = terminal(await collect(engine, PROMPTS[1], params))
                await wait_blocks_free(engine, timeout=60)

    anyio.run(main)
    for model, cases in asked.items():
        for name, (_, field) in cases.items():
            event = refusals[model, name]
            assert isinstance(event, Rejected) and event.field == field, (model, name, event)
    message = refusals["tok", "generate"].message  # type: ignore[union-attr]
    assert "token-classification" in message and "token_classify" in message
    assert "token_classify" in refusals["lm", "token_classify"].message  # type: ignore[union-attr]
