"""Every row's final hidden state of the target's forward, for an EAGLE head (gpu/eagle_runner.py).

The model's forward normally normalizes only the rows it computes logits for. With a
FinalHidden installed (DecoderModel.final_hidden), it normalizes every row of the step and
writes them here before picking the logits rows, on every path alike: eager, the decode
graphs and the mixed-step graphs (a graph captures the write into this one static buffer,
so after a replay the rows are read here like after an eager step; padding rows of a graph's
bucket are written too and never read):

    step rows      | seq 0: 5 chunk tokens | seq 1: t d1 d2 (verified) | padding ...
    buffer[row]    | h0  h1  h2  h3  h4    | h40 h41 h42                | (junk)

The state is the one EAGLE-1 heads are trained on: after the model's final norm, the input
of lm_head (vLLM's Llama forward returns it so too).
"""

from __future__ import annotations

import torch


class FinalHidden:
    """A static buffer [max_rows, hidden] of the last forward's post-norm hidden states."""

    def __init__(
        self, max_rows: int, hidden_size: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.max_rows = max_rows
        self.buffer = torch.zeros(max_rows, hidden_size, dtype=dtype, device=device)

    def put(self, hidden: torch.Tensor) -> None:
        """The forward's rows (called by DecoderModel.forward, also while a graph captures)."""
        assert len(hidden) <= self.max_rows, (
            f"a step of {len(hidden)} rows outgrows the final-hidden buffer of {self.max_rows}"
        )
        self.buffer[: len(hidden)].copy_(hidden)

    def rows(self, num_rows: int) -> torch.Tensor:
        """The last forward's first `num_rows` rows (a view: read before the next forward)."""
        return self.buffer[:num_rows]
