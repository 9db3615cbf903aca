"""Sequence-classification, reward and token-classification models: HF
`*ForSequenceClassification` and `*ForTokenClassification` checkpoints.

A sequence classifier is the decoder (`model.*`) and a `score` head [num_labels, hidden], no
bias; transformers pools the last non-pad token's final hidden state (after the model's norm)
and applies the head. Here each request's own last prompt token is pooled (messages/pooling.py,
`task="classify"`) and the head runs on that fp32 row (gpu/scored_forward.py). A token
classifier's `score` has a bias [num_labels] (transformers' `token_classification_bias`,
default true) and runs on every token's final hidden state after the norm (its dropout is a
no-op in eval): `task="token_classify"`, which a sequence classifier serves too, as vLLM's.
Torch-free: the engine reads the labels before it picks a runner. The classify activation
is vLLM's (`PoolerClassify` after `problem_type`):

    problem_type                    activation
    regression                      none (the logits)
    multi_label_classification      sigmoid per label
    single_label_classification     softmax over the labels
    unset                           softmax; sigmoid when num_labels is 1 (reward models)

token_classify's is vLLM's for every model: softmax over the labels, sigmoid for one label.
No lm_head ships: the one token such a request generates (and drops) is drawn through the
embedding matrix, as a tied model's would be.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal

Activation = Literal["softmax", "sigmoid", "none"]
# families whose decoder troupe runs, in transformers' class names
SUPPORTED_CLASSIFIERS = (
    "LlamaForSequenceClassification",
    "MistralForSequenceClassification",
    "Qwen2ForSequenceClassification",
    "Qwen3ForSequenceClassification",
)
SUPPORTED_TOKEN_CLASSIFIERS = (
    "LlamaForTokenClassification",
    "MistralForTokenClassification",
    "Qwen2ForTokenClassification",
    "Qwen3ForTokenClassification",
)
# heads troupe does not run: refused by name rather than loaded as a causal LM
_HEAD_SUFFIXES = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")
_OTHER_HEADS = ("Qwen2ForRewardModel", "Qwen2ForProcessRewardModel", "LlamaForRewardModel")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassifierConfig:
    """The score head of a classification checkpoint."""

    labels: tuple[str, ...]  # id2label in id order ("LABEL_i" where the config names none)
    activation: Activation = "softmax"  # classify's, after problem_type
    is_per_token: bool = False  # a *ForTokenClassification model: token_classify only
    has_bias: bool = False  # the head's bias [num_labels] (token classifiers)

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def token_activation(self) -> Activation:
        """token_classify's activation (vLLM's `PoolerClassify` over each row's labels)."""
        return "sigmoid" if self.num_labels < 2 else "softmax"


def read_classifier(cfg: dict[str, Any]) -> ClassifierConfig | None:
    """The head a config.json declares (None: a causal LM); ValueError naming what is not run."""
    architectures = [str(a) for a in cfg.get("architectures") or ()]
    heads = [a for a in architectures if a.endswith(_HEAD_SUFFIXES) or a in _OTHER_HEADS]
    if not heads:
        return None
    arch = heads[0]
    supported = SUPPORTED_CLASSIFIERS + SUPPORTED_TOKEN_CLASSIFIERS
    if arch not in supported:
        raise ValueError(
            f"config.json: architecture {arch!r} is not supported; classification models run "
            f"as {', '.join(supported)}"
        )
    id2label = cfg.get("id2label") or {}
    num_labels = int(cfg.get("num_labels") or len(id2label) or 2)
    try:
        named = {int(k): str(v) for k, v in id2label.items()}
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError("config.json: id2label must map label ids to names") from exc
    if named and sorted(named) != list(range(num_labels)):
        raise ValueError(
            f"config.json: id2label has ids {sorted(named)}, expected 0 .. {num_labels - 1}"
        )
    labels = tuple(named.get(i, f"LABEL_{i}") for i in range(num_labels))
    problem = cfg.get("problem_type")
    activation: Activation = "softmax"
    if problem == "regression":
        activation = "none"
    elif problem == "multi_label_classification" or (problem is None and num_labels == 1):
        activation = "sigmoid"
    is_per_token = arch in SUPPORTED_TOKEN_CLASSIFIERS
    return ClassifierConfig(
        labels=labels,
        activation=activation,
        is_per_token=is_per_token,
        has_bias=is_per_token and bool(cfg.get("token_classification_bias", True)),
    )


def read_folder_classifier(path: Path) -> ClassifierConfig | None:
    """The head of an HF folder's config.json (None: not a folder, or a causal LM)."""
    config_file = path / "config.json"
    if not path.is_dir() or not config_file.is_file():
        return None
    try:
        cfg = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return None  # the model's load names the broken file
    return read_classifier(cfg) if isinstance(cfg, dict) else None
