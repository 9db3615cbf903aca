"""Embeddings: a prompt's final hidden states pooled into one vector (SamplingParams.pooling).

vLLM's pooling models and sentence-transformers' poolers: `last` takes the prompt's last token
(decoder embedding models such as Qwen3-Embedding), `mean` averages every prompt token, `cls`
takes the first. The hidden states are those after the model's final norm, in fp32; with
`normalize` the vector is scaled to unit L2 norm.

`task="classify"` (a `*ForSequenceClassification` model, gpu/classifier_config.py): the pooled
vector goes through the model's score head, and the request's vector is the head's logits,
[num_labels]; `normalize` then applies the classifier's activation (vLLM's `use_activation`:
softmax over the labels, sigmoid for one label or multi-label models, none for regression).

Per-token tasks (vLLM's, `type` unused: every prompt position is read) give one row per prompt
token, the vector holding the P rows one after another (row-major [P, width], P the prompt's
tokens, `Finished.usage.prompt_tokens`):

    token_embed     each final hidden state [hidden]; `normalize`: each row to unit L2 norm
    token_classify  each one through the score head [num_labels] (a `*ForTokenClassification`
                    or `*ForSequenceClassification` model); `normalize`: softmax over the
                    labels per row (sigmoid for one label), as vLLM's token_classify pooler
"""

from __future__ import annotations

from typing import Literal

import msgspec

PoolingType = Literal["last", "mean", "cls"]
PoolingTask = Literal["embed", "classify", "token_embed", "token_classify"]
PER_TOKEN_TASKS: tuple[PoolingTask, ...] = ("token_embed", "token_classify")


class Pooling(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to pool the prompt into an embedding (on the request's first event)."""

    type: PoolingType = "last"  # unused by the per-token tasks
    normalize: bool = True  # embed: unit L2 norm; classify: the classifier's activation
    task: PoolingTask = "embed"

    @property
    def is_per_token(self) -> bool:
        """Whether the vector holds one row per prompt token (token_embed, token_classify)."""
        return self.task in PER_TOKEN_TASKS

    @property
    def is_classify(self) -> bool:
        """Whether the rows go through the model's score head (classify, token_classify)."""
        return self.task in ("classify", "token_classify")

    @property
    def reads_every_position(self) -> bool:
        """Whether positions before the last are read (no prefix-cache hit may skip them)."""
        return self.type != "last" or self.is_per_token


class Pooled(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A request's embedding, from the step that computed its prompt's last token."""

    request_id: str
    embedding: tuple[float, ...]  # per-token tasks: the rows one after another
