"""Sequence classification (Pooling(task="classify")) through the whole engine on tiny random
Llama and Qwen3 `*ForSequenceClassification` checkpoints against transformers: probabilities
and logits of prompts of different lengths run together in chunks; the labels the engine
reads; a generation request and an embedding refused naming `model`, a classify request to a
causal LM naming `pooling`; heads troupe does not run refused by name at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, wait_blocks_free
from troupe import Engine, EngineConfig
from troupe.gpu.classifier_config import read_classifier
from troupe.gpu.model_config import ModelConfig, ModelLoadError
from troupe.messages import Finished, Pooling, Rejected, SamplingParams, StreamEvent

from tests.gpu.tiny_classifier import LABELS, hf_logits, tiny_classifier
from tests.gpu.tiny_qwen3 import tiny_folder

PROMPTS = [[(13 * i + 5 * j + j * j) % 256 for j in range(3 + 9 * i)] for i in range(4)]
PROBS = SamplingParams(max_tokens=1, temperature=0.0, pooling=Pooling(task="classify"))
LOGITS = SamplingParams(
    max_tokens=1, temperature=0.0, pooling=Pooling(task="classify", normalize=False)
)


def _config(folder: Path) -> EngineConfig:
    return EngineConfig(
        device="cpu",
        model=str(folder),
        max_model_len=128,
        max_num_seqs=8,
        max_num_batched_tokens=12,  # prompts of 3-30 tokens come in chunks, several a step
        enable_prefix_caching=True,
    )


def _vector(events: list[StreamEvent]) -> torch.Tensor:
    assert isinstance(terminal(events), Finished), events
    first = events[0]
    assert isinstance(first, Finished) or first.embedding is not None
    assert first.embedding is not None
    return torch.tensor(first.embedding)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_probs_and_logits_equal_transformers(tmp_path: Path, family: str) -> None:
    hf_model = tiny_classifier(tmp_path / "clf", family)
    results: dict[str, list[StreamEvent]] = {}
    labels: tuple[str, ...] = ()

    async def main() -> None:
        nonlocal labels
        async with Engine.open(_config(tmp_path / "clf")) as engine:
            labels = engine.classifier_labels

            async def one(name: str, prompt: list[int], params: SamplingParams) -> None:
                results[name] = await collect(engine, prompt, params)

            async with anyio.create_task_group() as tg:
                for i, prompt in enumerate(PROMPTS):
                    tg.start_soon(one, f"probs{i}", prompt, PROBS)
                    tg.start_soon(one, f"logits{i}", prompt, LOGITS)
            results["again"] = await collect(engine, PROMPTS[3], PROBS)  # a prefix-cache hit
            await wait_blocks_free(engine, timeout=60)

    anyio.run(main)
    assert labels == tuple(LABELS.values())
    for i, prompt in enumerate(PROMPTS):
        want = hf_logits(hf_model, prompt)
        assert _vector(results[f"logits{i}"]) == pytest.approx(want, abs=1e-4)
        probs = _vector(results[f"probs{i}"])
        assert probs == pytest.approx(torch.softmax(want, dim=-1), abs=1e-5)
        assert float(probs.sum()) == pytest.approx(1.0, abs=1e-5)
    again = terminal(results["again"])
    assert isinstance(again, Finished) and again.usage.cached_tokens > 0
    want = torch.softmax(hf_logits(hf_model, PROMPTS[3]), dim=-1)
    assert _vector(results["again"]) == pytest.approx(want, abs=1e-5)
    # the prompts' probabilities differ: the test tells prompts apart
    assert not torch.allclose(_vector(results["probs0"]), _vector(results["probs3"]), atol=1e-3)


def test_a_classifier_refuses_generation_and_an_lm_refuses_classify(
    tmp_path: Path, hf_folder: Any
) -> None:
    tiny_classifier(tmp_path / "clf", "qwen3")
    lm_folder, _ = tiny_folder(hf_folder, tmp_path)
    refusals: dict[str, StreamEvent] = {}

    async def main() -> None:
        async with Engine.open(_config(tmp_path / "clf")) as engine:
            plain = SamplingParams(max_tokens=4, temperature=0.0)
            refusals["generate"] = terminal(await collect(engine, PROMPTS[1], plain))
            embed = SamplingParams(max_tokens=1, pooling=Pooling())
            refusals["embed"] = terminal(await collect(engine, PROMPTS[1], embed))
            two = SamplingParams(max_tokens=2, pooling=Pooling(task="classify"))
            refusals["two"] = terminal(await collect(engine, PROMPTS[1], two))
        async with Engine.open(_config(lm_folder)) as engine:
            assert engine.classifier_labels == ()
            refusals["lm"] = terminal(await collect(engine, PROMPTS[1], PROBS))

    anyio.run(main)
    for name, field in (("generate", "model"), ("embed", "model"), ("two", "max_tokens")):
        event = refusals[name]
        assert isinstance(event, Rejected) and event.field == field, event
    assert "sequence-classification" in refusals["generate"].message  # type: ignore[union-attr]
    lm = refusals["lm"]
    assert isinstance(lm, Rejected) and lm.field == "pooling" and "classify" in lm.message


def test_config_reading_of_heads() -> None:
    base = {"model_type": "qwen3", "num_attention_heads": 4, "hidden_size": 64}
    cfg = {**base, "architectures": ["Qwen3ForSequenceClassification"], "num_labels": 2}
    clf = read_classifier(cfg)
    assert clf is not None and clf.labels == ("LABEL_0", "LABEL_1")
    assert clf.activation == "softmax"
    reward = read_classifier({**cfg, "num_labels": 1, "id2label": {"0": "score"}})
    assert reward is not None and reward.labels == ("score",) and reward.activation == "sigmoid"
    regression = read_classifier({**cfg, "problem_type": "regression"})
    assert regression is not None and regression.activation == "none"
    assert read_classifier({**base, "architectures": ["Qwen3ForCausalLM"]}) is None
    for arch in ("Qwen2ForRewardModel", "GemmaForSequenceClassification"):
        with pytest.raises(ValueError, match=arch):
            read_classifier({**base, "architectures": [arch]})
    full = {**base, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256}
    with pytest.raises(ModelLoadError, match="Qwen2ForQuestionAnswering"):
        ModelConfig.from_hf_dict({**full, "architectures": ["Qwen2ForQuestionAnswering"]})
    assert not clf.is_per_token and not clf.has_bias
    token = read_classifier({**cfg, "architectures": ["Qwen2ForTokenClassification"]})
    assert token is not None and token.is_per_token and token.has_bias
    unbiased = {**cfg, "architectures": ["LlamaForTokenClassification"]}
    token = read_classifier({**unbiased, "token_classification_bias": False})
    assert token is not None and token.is_per_token and not token.has_bias
    # token_classify's activation is vLLM's by label count, not problem_type's
    assert regression.token_activation == "softmax" and reward.token_activation == "sigmoid"
    loaded = ModelConfig.from_hf_dict({**full, **cfg})
    assert loaded.classifier == clf and loaded.tie_word_embeddings
