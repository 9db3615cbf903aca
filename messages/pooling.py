"""Embeddings: a prompt's final hidden states pooled into one vector (SamplingParams.pooling).

vLLM's pooling models and sentence-transformers' poolers: `last` takes the prompt's last token
(decoder embedding models such as Qwen3-Embedding), `mean` averages every prompt token, `cls`
takes the first. The hidden states are those after the model's final norm, in fp32; with
`normalize` the vector is scaled to unit L2 norm.

`task="classify"` (a `*ForSequenceClassification` model, gpu/classifier_head.py): the pooled
vector goes through the model's score head, and the request's vector is the head's logits,
[num_labels]; `normalize` then applies the classifier's activation (vLLM's `use_activation`:
softmax over the labels, sigmoid for one label or multi-label models, none for regression).
"""

from __future__ import annotations

from typing import Literal

import msgspec

PoolingType = Literal["last", "mean", "cls"]
PoolingTask = Literal["embed", "classify"]


class Pooling(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to pool the prompt into an embedding (on the request's first event)."""

    type: PoolingType = "last"
    normalize: bool = True  # embed: unit L2 norm; classify: the classifier's activation
    task: PoolingTask = "embed"

    @property
    def reads_every_position(self) -> bool:
        """Whether positions before the last are pooled (no prefix-cache hit may skip them)."""
        return self.type != "last"


class Pooled(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A request's embedding, from the step that computed its prompt's last token."""

    request_id: str
    embedding: tuple[float, ...]
