"""How a score request (/v1/score, /v1/rerank, LLM.score) pairs texts, and what a pair scores
(the pure part).

    text_1 "q"         text_2 ["a", "q", "b"]   1:N  pairs (q,a) (q,q) (q,b)   texts q a b
    text_1 ["x", "y"]  text_2 ["a", "b"]        N:N  pairs (x,a) (y,b)         texts x y a b
    text_1 ["x", "y"]  text_2 "a"               refused by the body's parser (vLLM's rule)

What a pair scores depends on the model (`score_kind`, vLLM's two ways):

    embedding model (a causal LM pooled)   "embed": each distinct text runs as one engine
        request, however often it is named (`q` above runs once, and scores 1 against
        itself); a pair scores the cosine similarity of its two vectors, in float64; a zero
        vector scores 0 against anything (torch's CosineSimilarity, which vLLM uses, clamps
        the norms the same way)
    one-label sequence classifier          "cross": a cross-encoder (a reranker such as a
        Qwen3-Reranker seq-cls checkpoint): each pair runs as one request of the two texts
        encoded together as the tokenizer encodes a pair (its post-processor's pair template,
        as transformers' `tokenizer(text_1, text_2)`), and scores the head's activated logit
    any other classifier                   refused, naming `model`
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

ScoreKind = Literal["embed", "cross"]

Named = tuple[str, str]  # (where the client gave it: `text_2[1]`, `query`; the text)


@dataclasses.dataclass(frozen=True)
class Pairing:
    """The distinct texts to embed and the pairs to score, in the client's order."""

    texts: tuple[str, ...]  # first-seen order: one engine request each
    names: tuple[str, ...]  # where each text was first given, for a rejection's field
    pairs: tuple[tuple[int, int], ...]  # (left, right) indexes into texts, one per score

    @property
    def num_scores(self) -> int:
        return len(self.pairs)

    def pair_prompts(self, encode_pair: Callable[[str, str], list[int]]) -> list[list[int]]:
        """A cross-encoder's prompts: each pair's two texts encoded together, in order."""
        return [encode_pair(self.texts[left], self.texts[right]) for left, right in self.pairs]


def pair_texts(left: Sequence[Named], right: Sequence[Named]) -> Pairing:
    """One left text against every right one (1:1, 1:N), or left[i] against right[i] (N:N)."""
    assert left and right, "each side names a text"
    assert len(left) in (1, len(right)), f"{len(left)} against {len(right)}: 1:N or N:N only"
    index: dict[str, int] = {}
    names: list[str] = []

    def slot(named: Named) -> int:
        name, text = named
        if text not in index:
            index[text] = len(index)
            names.append(name)
        return index[text]

    lefts = [slot(one) for one in left]
    rights = [slot(one) for one in right]
    if len(lefts) == 1:
        lefts *= len(rights)
    return Pairing(tuple(index), tuple(names), tuple(zip(lefts, rights, strict=True)))


def cosine_scores(
    vectors: Sequence[Sequence[float]], pairs: Sequence[tuple[int, int]]
) -> list[float]:
    """Each pair's cosine similarity, in [-1, 1]; a pair with a zero vector scores 0."""
    matrix = np.asarray(vectors, dtype=np.float64)
    assert matrix.ndim == 2, "every vector has the model's one width"
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    unit = np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)
    # one dot product per pair: no (pairs x width) copies of the vectors
    return [float(np.clip(unit[i] @ unit[j], -1.0, 1.0)) for i, j in pairs]


def score_kind(model: str, labels: Sequence[str], is_token_classifier: bool) -> ScoreKind:
    """How `model` scores a pair, from its score head's `labels` (none: not a classifier);
    ValueError naming the model when it cannot score."""
    if not labels:
        return "embed"
    if len(labels) == 1 and not is_token_classifier:
        return "cross"
    what = "a token-classification model" if is_token_classifier else f"{len(labels)} labels"
    raise ValueError(
        f"model {model!r} cannot score pairs: it is a classifier with {what}; score needs an "
        "embedding model or a cross-encoder (a sequence classifier with one label)"
    )


__all__ = ["Named", "Pairing", "ScoreKind", "cosine_scores", "pair_texts", "score_kind"]
