"""Arrival counters for the kernels whose last program to finish merges the others' partials
(split-K decode attention, MLA decode, the int4 GEMV): each program writes its partial, then
counts itself in with an acq_rel atomic; the one that finds the count at splits - 1 merges in
a fixed order (the result does not depend on timing) and sets the counter back to zero."""

from __future__ import annotations

import torch

_COUNTERS: dict[torch.device, torch.Tensor] = {}
# Every counter buffer ever handed out stays alive: a captured CUDA graph keeps its pointer.
_KEEP: list[torch.Tensor] = []


def arrival_counters(size: int, device: torch.device) -> torch.Tensor:
    """A zeroed int32 buffer of at least `size` counters for `device`, reused across launches
    (the kernels leave it zeroed); one stream per device uses it at a time."""
    have = _COUNTERS.get(device)
    if have is None or have.numel() < size:
        have = torch.zeros(max(size, 1 << 16), dtype=torch.int32, device=device)
        _COUNTERS[device] = have
        _KEEP.append(have)
    return have
