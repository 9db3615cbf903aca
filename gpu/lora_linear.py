"""Batched LoRA: every token of a step runs through its own adapter (or none).

The max_loras adapter slots sit side by side, each padded to rank R = max_lora_rank:

    A_all [L x S x R, K]   slot-major: slot l's rows of slice s at (l S + s) R (S: the
                           projection's fused slices, q/k/v or gate/up); zero rows pad
    B_s   [n_s, L x R]     per slice, slot l's columns at l R; already scaled by alpha / r

Three ways to run a step, chosen by the runtime (gpu/lora_runtime.py):

- masked, for a step a CUDA graph replays (no branch on data) and for an eager step of several
  adapters: two GEMMs per projection over all slots, y = W x + sum_s B_s (((A_all x) * mask)_s),
  mask [T, L] 1 where slot l is token t's. A token without an adapter (slot -1) gets y = W x
  exactly; the extra work is L x R columns whichever adapters run (64 at the defaults: 6% of a
  1,024-wide projection).
- one slot, for an eager step whose every token runs one adapter: its S x R rows of A_all
  (contiguous, slot-major), then each slice's columns of B.
- off, for an eager step without adapters: the projection adds nothing.
- punica (EngineConfig.lora_kernel "punica"), in the masked form's place: each token through
  its own slot only, u = A_l x (the shrink) then y += B_l u (the expand), on tokens grouped by
  slot in tiles (kernels/lora_tiles.py): the work follows the step's tokens, not L x R. Triton
  kernels on CUDA (kernels/lora_shrink.py, kernels/lora_expand.py; graph-safe: static grid,
  the tile plan a static buffer the host fills with token_slots), the torch reference
  elsewhere (kernels/lora_reference.py).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from troupe.config import LoraKernel
from troupe.gpu.device_inputs import host_to_device
from troupe.gpu.quant_linear import Projection, QuantLinear, linear
from troupe.kernels.lora_reference import lora_expand_reference, lora_shrink_reference
from troupe.kernels.lora_tiles import TokenTiles, slice_bounds


class LoraSlots:
    """The step's per-token slot ids (a static buffer: graphs replay it), and how this
    forward's projections run them: masked (the mask made by begin) or punica (`kernel`),
    one slot, or off. `use_triton` (None: on CUDA) runs punica's Triton kernels, whose tile
    plan (`tiles`) `write` fills beside the slot ids."""

    def __init__(
        self,
        max_loras: int,
        max_rank: int,
        max_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
        kernel: LoraKernel = "masked",
        use_triton: bool | None = None,
    ) -> None:
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.dtype = dtype
        self.kernel = kernel
        self.token_slots = torch.full((max_tokens,), -1, dtype=torch.int64, device=device)
        is_triton = device.type == "cuda" if use_triton is None else use_triton
        self.tiles = (
            TokenTiles(max_tokens, max_loras, device) if kernel == "punica" and is_triton else None
        )
        self._slot_ids = torch.arange(max_loras, device=device)
        self.mask = torch.zeros(0, max_loras, dtype=dtype, device=device)
        # the next forward's mode (set by LoraRuntime.prepare; graphs capture the default):
        # off (is_active False), one slot for every token (only_slot), else masked
        self.is_active = True
        self.only_slot: int | None = None

    @property
    def device(self) -> torch.device:
        return self.token_slots.device

    def device_tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor it holds (sleep mode keeps them: gpu/sleep_parts.py)."""
        held = (self.token_slots, self._slot_ids, self.mask)
        return held if self.tiles is None else (*held, self.tiles.buffer)

    def write(self, token_slots: np.ndarray) -> None:
        """The step's slot per token (-1: none), queued into the static buffers."""
        staged = host_to_device(token_slots.astype(np.int64, copy=False), self.device)
        self.token_slots[: len(token_slots)].copy_(staged)
        if self.tiles is not None:
            self.tiles.write(token_slots)

    def begin(self, num_tokens: int) -> None:
        """Before a forward's layers: the mask of its first `num_tokens` tokens (masked)."""
        if self.is_active and self.only_slot is None and self.kernel == "masked":
            slots = self.token_slots[:num_tokens, None]
            self.mask = (slots == self._slot_ids[None, :]).to(self.dtype)


def base_weight(weight: Projection) -> Projection:
    """The weight under a projection's adapters (itself without them): the CPU decode path
    (gpu/cpu_decode.py, gpu/cpu_layers.py) runs it for steps without adapters."""
    return weight.base if isinstance(weight, LoraLinear) else weight


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
        dtype, device = slots.dtype, slots.device
        lora, rank = slots.max_loras, slots.max_rank
        self.a_all = torch.zeros(lora * len(slices) * rank, in_features, dtype=dtype, device=device)
        self._a = self.a_all.view(lora, len(slices), rank, in_features)
        # B_s stacked [sum(slices), L R] (the punica expand reads them as one), b[s] a view
        self.b_all = torch.zeros(sum(slices), lora * rank, dtype=dtype, device=device)
        starts = [sum(slices[:i]) for i in range(len(slices))]
        self.b = [self.b_all[start : start + n] for start, n in zip(starts, slices, strict=True)]
        self._bounds = list(zip(starts, slices, strict=True))
        self._bounds_table = slice_bounds(slices, device)  # the expand kernel's

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(self.slices), self.a_all.shape[1])

    def device_tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor it holds beside its base: the slots' factors (sleep mode keeps the
        adapters they hold: gpu/sleep_parts.py)."""
        return (self.a_all, self.b_all, self._bounds_table)

    def load(self, slot: int, index: int, a: torch.Tensor | None, b: torch.Tensor | None) -> None:
        """Put slice `index`'s factors (A [r, K], scaled B [n, r]; None: not targeted) in
        `slot`, zero past their rank; a queued copy on CUDA (stream order: the forwards queued
        before it read the slot's old weights)."""
        r_max = self.slots.max_rank
        a_rows = self._a[slot, index]
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
        slots = self.slots
        if not slots.is_active:
            return out
        if slots.only_slot is None:
            return self._masked(x, out) if slots.kernel == "masked" else self._punica(x, out)
        slot, rank, num_slices = slots.only_slot, slots.max_rank, len(self.slices)
        shrunk = F.linear(x, self.a_all[slot * num_slices * rank : (slot + 1) * num_slices * rank])
        for index, (start, size) in enumerate(self._bounds):
            part = shrunk[:, index * rank : (index + 1) * rank]
            b = self.b[index][:, slot * rank : (slot + 1) * rank]
            out[:, start : start + size].addmm_(part, b.t())
        return out

    def _masked(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        lora, rank, num_slices = self.slots.max_loras, self.slots.max_rank, len(self.slices)
        num_tokens = x.shape[0]
        shrunk = F.linear(x, self.a_all).view(num_tokens, lora, num_slices, rank)
        shrunk = shrunk * self.slots.mask[:, :, None, None]
        for index, (start, size) in enumerate(self._bounds):
            part = shrunk[:, :, index].reshape(num_tokens, lora * rank)
            out[:, start : start + size].addmm_(part, self.b[index].t())
        return out

    def _punica(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        slots, num_slices = self.slots, len(self.slices)
        if slots.tiles is None:  # the CPU: per-slot gathers
            u = lora_shrink_reference(x, self.a_all, slots.token_slots, num_slices, slots.max_rank)
            lora_expand_reference(out, u, self.b_all, slots.token_slots, self.slices)
            return out
        # Triton only here: a CPU engine never imports it (tests/test_cpu_imports.py)
        from troupe.kernels.lora_expand import lora_expand
        from troupe.kernels.lora_shrink import lora_shrink

        u_parts = lora_shrink(x, self.a_all, slots.tiles, num_slices, slots.max_rank)
        lora_expand(out, u_parts, self.b_all, slots.tiles, self._bounds_table, max(self.slices))
        return out
