"""Per-token pooling (vLLM's `token_embed`, `token_classify`): every prompt row's output, kept
chunk after chunk until the prompt's last position is in, then sent as one vector.

Each chunk's rows (gpu/hidden_rows.py: the positions < P it holds) are turned into their
outputs at once, so only [rows, width] is kept, never the hidden states of a classify task:

    token_embed     the fp32 final hidden state, to unit L2 norm per row with `normalize`
    token_classify  the score head's logits per row (gpu/scored_forward.Classifier), with
                    `normalize` vLLM's token activation (softmax per row; sigmoid, one label)

A chunk at position 0 starts the rows over (a recompute after preemption); a request released
before its prompt is whole is forgotten (ScoredForward.forget).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from troupe.gpu.hidden_rows import PooledSeq
from troupe.messages.pooling import Pooled

# the score head over rows [R, hidden] -> [R, num_labels], activated when asked
RowHead = Callable[[torch.Tensor, bool], torch.Tensor]


class TokenRows:
    """The per-token outputs of prompts under way."""

    def __init__(self, head: RowHead | None) -> None:
        self.head = head  # a classification model's score head over rows
        self._parts: dict[str, list[torch.Tensor]] = {}

    def add(self, seq: PooledSeq, hidden: torch.Tensor) -> Pooled | None:
        """Take a chunk's rows [seq.num_rows, hidden]; the request's vector once whole."""
        rows = hidden.float()
        if seq.task == "token_classify":
            assert self.head is not None, "admission lets token_classify in on classifiers"
            out = self.head(rows, seq.normalize)
        elif seq.normalize:
            out = torch.nn.functional.normalize(rows, dim=-1)
        else:
            out = rows
        parts = self._parts.pop(seq.request_id, [])
        if seq.first:  # a prompt computed again starts over
            parts = []
        parts.append(out)
        if not seq.done:
            self._parts[seq.request_id] = parts
            return None
        whole = torch.cat(parts) if len(parts) > 1 else parts[0]
        return Pooled(seq.request_id, tuple(whole.flatten().tolist()))

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop the rows of requests released before their prompts were whole."""
        if not self._parts:
            return
        for request_id in request_ids:
            self._parts.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._parts)
