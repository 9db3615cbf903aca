"""Embeddings: a prompt's final hidden states pooled into one vector (SamplingParams.pooling).

vLLM's pooling models and sentence-transformers' poolers: `last` takes the prompt's last token
(decoder embedding models such as Qwen3-Embedding), `mean` averages every prompt token, `cls`
takes the first. The hidden states are those after the model's final norm, in fp32; with
`normalize` the vector is scaled to unit L2 norm.
"""

from __future__ import annotations

from typing import Literal

import msgspec

PoolingType = Literal["last", "mean", "cls"]


class Pooling(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to pool the prompt into an embedding (on the request's first event)."""

    type: PoolingType = "last"
    normalize: bool = True

    @property
    def reads_every_position(self) -> bool:
        """Whether positions before the last are pooled (no prefix-cache hit may skip them)."""
        return self.type != "last"


class Pooled(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A request's embedding, from the step that computed its prompt's last token."""

    request_id: str
    embedding: tuple[float, ...]
