"""A tiny random `*ForSequenceClassification` model (3 labels, named; or one, a reward model's
head), or a `*ForTokenClassification` one (its head with a bias), saved with a word tokenizer,
and its transformers twin, for the classification tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.weights import random_weights

from tests.gpu.conftest import FAMILIES, TINY, add_word_tokenizer

LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def tiny_classifier(
    folder: Path,
    family: str,
    seed: int = 0,
    labels: dict[int, str] | None = None,
    *,
    per_token: bool = False,
) -> Any:
    """Save a random classifier of `family` in `folder` (its labels: LABELS unless `labels`;
    `{}`: one unnamed label, a reward model's head; `per_token`: a token classifier's head);
    return the transformers model."""
    import transformers

    labels = LABELS if labels is None else labels
    num_labels = max(len(labels), 1)
    named = {"id2label": labels, "label2id": {v: k for k, v in labels.items()}} if labels else {}

    cls_name = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
    kwargs = {**TINY, **FAMILIES[family], "max_position_embeddings": 128}
    hf_config = getattr(transformers, f"{cls_name}Config")(
        **kwargs,
        num_labels=num_labels,
        **named,
    )
    arch = f"{cls_name}For{'Token' if per_token else 'Sequence'}Classification"
    hf_model = getattr(transformers, arch)(hf_config).eval()
    ours = ModelConfig.from_hf_dict({**hf_config.to_dict(), "architectures": [arch]})
    weights = random_weights(ours, torch.float32, seed, std=0.2)
    gen = torch.Generator().manual_seed(seed + 1)
    weights["score.weight"] = torch.randn(num_labels, TINY["hidden_size"], generator=gen)
    if per_token:  # transformers' token head has a bias (token_classification_bias)
        weights["score.bias"] = torch.randn(num_labels, generator=gen)
    missing, unexpected = hf_model.load_state_dict(weights, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    hf_model.save_pretrained(folder)
    add_word_tokenizer(folder)
    return hf_model


def hf_logits(hf_model: Any, prompt: list[int]) -> torch.Tensor:
    """transformers' logits for one prompt: [num_labels] (its last token pooled), or a token
    classifier's [P, num_labels]."""
    with torch.no_grad():
        return hf_model(torch.tensor([prompt])).logits[0].float()


def hf_hidden(hf_model: Any, prompt: list[int]) -> torch.Tensor:
    """transformers' final hidden states [P, hidden] (after the model's norm)."""
    with torch.no_grad():
        return hf_model.model(torch.tensor([prompt])).last_hidden_state[0].float()
