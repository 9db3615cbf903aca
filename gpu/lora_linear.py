"""Batched LoRA: every token of a step runs through its own adapter (or none), in two GEMMs
per projection that a CUDA graph can hold, with no gather of weights per token.

The max_loras adapter slots sit side by side, each padded to rank R = max_lora_rank:

    A_all [S x L*R, K]   (S: the projection's fused slices, q/k/v or gate/up; zero rows pad)
    B_s   [n_s, L*R]     (per slice; already scaled by alpha / r; zero columns pad)
    mask  [T, L*R]       1 where column c belongs to token t's slot (c // R == slot[t])

    y = W x + for each slice s:  B_s ((A_all x)_s * mask)

A token without an adapter (slot -1) has an all-zero mask row: y = W x exactly. The extra work
is 2 x S x L x R multiply-adds per token per output and input feature pair's worth of the
projection's sizes (L x R = 64 at the defaults: 6% of a 1,024-wide projection, 1.6% of a
4,096-wide one), and the slots' weights are read once per step, whichever adapters run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from troupe.gpu.quant_linear import QuantLinear, linear


class LoraSlots:
    """The step's per-token slot ids (a static buffer: graphs replay it) and the mask that
    DecoderModel.forward builds from them once per forward (begin)."""

    def __init__(
        self,
        max_loras: int,
        max_rank: int,
        max_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.dtype = dtype
        self.token_slots = torch.full((max_tokens,), -1, dtype=torch.int64, device=device)
        self._column_slot = torch.arange(max_loras * max_rank, device=device) // max_rank
        self.mask = torch.zeros(0, max_loras * max_rank, dtype=dtype, device=device)

    @property
    def device(self) -> torch.device:
        return self.token_slots.device

    @property
    def width(self) -> int:
        """L x R: the columns of every projection's stacked factors."""
        return self.max_loras * self.max_rank

    def begin(self, num_tokens: int) -> None:
        """The mask of the first `num_tokens` tokens, for this forward's projections."""
        slots = self.token_slots[:num_tokens, None]
        self.mask = (slots == self._column_slot[None, :]).to(self.dtype)


class LoraLinear:
    """A projection (dense or quantized) plus the adapters in the slots; see the module
    docstring. `slices`: the output widths of the fused projections, in order."""

    def __init__(
        self,
        base: torch.Tensor | QuantLinear,
        slices: tuple[int, ...],
        in_features: int,
        slots: LoraSlots,
    ) -> None:
        self.base = base
        self.slices = slices
        self.slots = slots
        dtype, device = slots.dtype, slots.token_slots.device
        width = slots.width
        self.a_all = torch.zeros(len(slices) * width, in_features, dtype=dtype, device=device)
        self.b = [torch.zeros(n, width, dtype=dtype, device=device) for n in slices]
        starts = [sum(slices[:i]) for i in range(len(slices))]
        self._bounds = list(zip(starts, slices, strict=True))

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(self.slices), self.a_all.shape[1])

    def load(self, slot: int, index: int, a: torch.Tensor | None, b: torch.Tensor | None) -> None:
        """Put slice `index`'s factors (A [r, K], scaled B [n, r]; None: not targeted) in
        `slot`, zero past their rank; a queued copy on CUDA (stream order: the forwards queued
        before it read the slot's old weights)."""
        r_max, width = self.slots.max_rank, self.slots.width
        a_rows = self.a_all[index * width + slot * r_max : index * width + (slot + 1) * r_max]
        b_cols = self.b[index][:, slot * r_max : (slot + 1) * r_max]
        a_rows.zero_()
        b_cols.zero_()
        if a is None or b is None:
            return
        rank = a.shape[0]
        a_rows[:rank].copy_(a, non_blocking=True)
        b_cols[:, :rank].copy_(b, non_blocking=True)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = linear(x, self.base)
        mask = self.slots.mask
        num_tokens, width = x.shape[0], self.slots.width
        shrunk = F.linear(x, self.a_all).view(num_tokens, len(self.slices), width)
        shrunk = shrunk * mask[:, None, :]
        if len(self.slices) == 1:
            return out.addmm_(shrunk[:, 0], self.b[0].t())
        for index, (start, size) in enumerate(self._bounds):
            out[:, start : start + size].addmm_(shrunk[:, index], self.b[index].t())
        return out
