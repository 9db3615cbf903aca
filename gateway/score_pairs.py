"""How /v1/score and /v1/rerank pair texts, and what a pair scores (the pure part).

    text_1 "q"         text_2 ["a", "q", "b"]   1:N  pairs (q,a) (q,q) (q,b)   texts q a b
    text_1 ["x", "y"]  text_2 ["a", "b"]        N:N  pairs (x,a) (y,b)         texts x y a b
    text_1 ["x", "y"]  text_2 "a"               refused by the body's parser (vLLM's rule)

Each distinct text runs as one engine request, however often it is named (`q` above runs once,
and scores 1 against itself); the pairs index into those texts. For an embedding model a pair
scores the cosine similarity of its two vectors (vLLM's rule for embedding models), in float64;
a zero vector scores 0 against anything (torch's CosineSimilarity, which vLLM uses, clamps the
norms the same way).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

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


__all__ = ["Named", "Pairing", "cosine_scores", "pair_texts"]
