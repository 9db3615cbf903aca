"""What an EAGLE head reads of every row of the target's forward (gpu/eagle_runner.py).

The model's forward normally keeps only the rows it computes logits for. With a TargetHidden
installed (DecoderModel.target_hidden) it writes every row of the step into one static
buffer, on every path alike: eager, the decode graphs and the mixed-step graphs (a graph
captures the writes into this one buffer, so after a replay the rows are read here like
after an eager step; padding rows of a graph's bucket are written too and never read):

    step rows      | seq 0: 5 chunk tokens | seq 1: t d1 d2 (verified) | padding ...
    buffer[row]    | h0  h1  h2  h3  h4    | h40 h41 h42                | (junk)

What a row holds is the head's `HiddenTaps`:
- EAGLE-1 (no layer ids): the state after the model's final norm, the input of lm_head (what
  EAGLE-1 heads are trained on; vLLM's Llama forward returns it so too). The forward then
  normalizes every row, not only the logits rows.
- EAGLE-3 (layer ids, vLLM's aux hidden states): the residual stream entering each of those
  layers, hidden + residual (id 0: the embedding; id num_layers: after the last layer,
  before the final norm), side by side in ascending id order: [rows, len(ids) * hidden].
  `hidden` is always the model's hidden_size; an EAGLE-3 head of another width (its
  target_hidden_size) brings the states to its own through its fc.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class HiddenTaps:
    """Which states of each row a head reads."""

    layer_ids: tuple[int, ...] = ()  # ascending, distinct; (): the final post-norm state

    @property
    def width(self) -> int:
        """How many hidden states a row holds side by side."""
        return max(1, len(self.layer_ids))


class TargetHidden:
    """A static buffer [max_rows, width * hidden] of the last forward's tapped states."""

    def __init__(
        self,
        taps: HiddenTaps,
        max_rows: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.taps = taps
        self.max_rows = max_rows
        self.hidden_size = hidden_size
        self.needs_final = not taps.layer_ids  # the forward normalizes every row for it
        self._slot = {layer: i for i, layer in enumerate(taps.layer_ids)}
        self.buffer = torch.zeros(max_rows, taps.width * hidden_size, dtype=dtype, device=device)

    def _check(self, num_rows: int) -> None:
        assert num_rows <= self.max_rows, (
            f"a step of {num_rows} rows outgrows the target-hidden buffer of {self.max_rows}"
        )

    def put_layer(self, layer: int, hidden: torch.Tensor, residual: torch.Tensor | None) -> None:
        """The residual stream entering `layer` (called by DecoderModel.forward before each
        layer and once after the last, also while a graph captures); kept if tapped."""
        slot = self._slot.get(layer)
        if slot is None:
            return
        self._check(len(hidden))
        stream = hidden if residual is None else hidden + residual
        h = self.hidden_size
        self.buffer[: len(hidden), slot * h : (slot + 1) * h].copy_(stream)

    def put_final(self, hidden: torch.Tensor) -> None:
        """Every row's post-norm state (EAGLE-1's taps)."""
        self._check(len(hidden))
        self.buffer[: len(hidden)].copy_(hidden)

    def rows(self, num_rows: int) -> torch.Tensor:
        """The last forward's first `num_rows` rows (a view: read before the next forward)."""
        return self.buffer[:num_rows]
