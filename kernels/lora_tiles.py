"""A step's tokens grouped by LoRA slot, in tiles, for the punica kernels (kernels/lora_shrink.py,
kernels/lora_expand.py): each tile is up to `tile_tokens` tokens of ONE slot, so a kernel
program loads that slot's A (or B) tile once and applies it to all its tokens.

    token_slots   0  2 -1  0  0  2  1 -1  0            (per token; -1: no adapter)
    order         0  3  4  8 | 6 | 1  5                (token ids grouped by slot, ascending
                  \\_ slot 0 _/ \\1/ \\slot 2/               within a slot; -1 tokens left out)
    tiles (tile_tokens 2):
        slot      0  0  1  2 -1 -1 ...                 (-1: an unused tile, its program exits)
        start     0  2  4  5
        end       2  4  5  7                           (positions in `order`, end exclusive)

The host already knows every token's slot (gpu/lora_runtime.py writes token_slots from the
step's adapters), so it groups them too (a stable argsort: ~40 us for 8,192 tokens on one CPU
core) and copies one small int32 buffer with the token ids: no sort kernel, no device sync, and
a CUDA graph replays the same buffer's new contents. A launch's grid is fixed by its static
size: T tokens in L slots make at most cdiv(T, tile) + min(L, T) tiles (each slot's last tile
may be partial), so `capacity(T)` programs cover any step of T tokens or fewer (a graph's
padding rows are in no tile: the kernels leave them alone).
"""

from __future__ import annotations

import numpy as np
import torch

# Tokens per tile. One tile reads its slot's factors once for up to this many tokens: at 64 an
# A tile of a fused q/k/v (3 slices x rank 16) is 0.75x the bytes of the 64 tokens' x it meets
# (3x at 16), both from L2 in a prefill; a decode's nearly empty tiles mask their rows off (no
# memory traffic), and the shrink splits K for the parallelism few tiles lack.
TILE_TOKENS = 64


def num_tiles(num_tokens: int, max_loras: int, tile_tokens: int = TILE_TOKENS) -> int:
    """The most tiles `num_tokens` tokens in `max_loras` slots need: a launch's grid size."""
    return -(-num_tokens // tile_tokens) + min(max_loras, num_tokens)


def plan_tiles(
    token_slots: np.ndarray, max_loras: int, capacity: int, tile_tokens: int = TILE_TOKENS
) -> tuple[np.ndarray, np.ndarray]:
    """The tile table [3, capacity] int32 (slot, start, end; slot -1 past the used tiles) and
    the grouped token ids `order` (int32, only the tokens with a slot)."""
    slots = np.asarray(token_slots, dtype=np.int64)
    if slots.size and (slots.max() >= max_loras or slots.min() < -1):
        raise ValueError(
            f"token slots must be in [-1, {max_loras}), got {slots.min()}..{slots.max()}"
        )
    ranked = np.argsort(slots, kind="stable")
    order = ranked[int(np.count_nonzero(slots < 0)) :].astype(np.int32)
    counts = np.bincount(slots[slots >= 0], minlength=max_loras)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    table = np.full((3, capacity), -1, dtype=np.int32)
    used = 0
    for slot in np.flatnonzero(counts):
        starts = np.arange(bounds[slot], bounds[slot + 1], tile_tokens)
        stop = used + len(starts)
        if stop > capacity:
            raise ValueError(f"{stop} tiles do not fit the table's {capacity}")
        table[0, used:stop] = slot
        table[1, used:stop] = starts
        table[2, used:stop] = np.minimum(starts + tile_tokens, bounds[slot + 1])
        used = stop
    return table, order


class TokenTiles:
    """The device buffers of a step's tile plan: static (CUDA graphs capture their addresses),
    for steps of up to `max_tokens` tokens in `max_loras` slots.

        buffer  [ slot (capacity) | start (capacity) | end (capacity) | order (max_tokens) ]
    """

    def __init__(
        self,
        max_tokens: int,
        max_loras: int,
        device: torch.device,
        tile_tokens: int = TILE_TOKENS,
    ) -> None:
        self.max_loras = max_loras
        self.tile_tokens = tile_tokens
        self.capacity = num_tiles(max_tokens, max_loras, tile_tokens)
        self.buffer = torch.full(
            (3 * self.capacity + max_tokens,), -1, dtype=torch.int32, device=device
        )
        self.table = self.buffer[: 3 * self.capacity].view(3, self.capacity)
        self.order = self.buffer[3 * self.capacity :]

    def grid_tiles(self, num_tokens: int) -> int:
        """The tile programs a launch over `num_tokens` rows runs (static: from the shape)."""
        return min(self.capacity, num_tiles(num_tokens, self.max_loras, self.tile_tokens))

    def write(self, token_slots: np.ndarray) -> None:
        """Plan the step whose tokens run in these slots (-1: none) and queue the copy."""
        if len(token_slots) > len(self.order):
            raise ValueError(f"{len(token_slots)} tokens pass the tile buffer ({len(self.order)})")
        table, order = plan_tiles(token_slots, self.max_loras, self.capacity, self.tile_tokens)
        host = np.concatenate([table.reshape(-1), order])
        staged = torch.from_numpy(host)
        if self.buffer.is_cuda:  # pinned: an async copy (a pageable one waits for the stream)
            staged = staged.pin_memory()
        self.buffer[: len(host)].copy_(staged, non_blocking=True)


def slice_bounds(slices: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The expand's per-slice (first column, width) table [S, 2] int64 for `slices`' widths."""
    starts = [sum(slices[:i]) for i in range(len(slices))]
    flat = [v for pair in zip(starts, slices, strict=True) for v in pair]
    return torch.tensor(flat, dtype=torch.int64, device=device).view(len(slices), 2)
