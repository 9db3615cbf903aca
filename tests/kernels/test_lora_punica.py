"""The punica LoRA kernels (kernels/lora_shrink.py, lora_expand.py) against the torch reference
(kernels/lora_reference.py), and the tile plan they read (kernels/lora_tiles.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from troupe.kernels.lora_expand import lora_expand
from troupe.kernels.lora_reference import lora_expand_reference, lora_shrink_reference
from troupe.kernels.lora_shrink import lora_shrink
from troupe.kernels.lora_tiles import TokenTiles, num_tiles, plan_tiles, slice_bounds

CPU = torch.device("cpu")


def test_the_plan_groups_tokens_by_slot_in_tiles() -> None:
    """The module docstring's example: tokens without a slot are in no tile."""
    table, order = plan_tiles(np.array([0, 2, -1, 0, 0, 2, 1, -1, 0]), 3, 8, tile_tokens=2)
    assert order.tolist() == [0, 3, 4, 8, 6, 1, 5]
    assert table[:, :4].tolist() == [[0, 0, 1, 2], [0, 2, 4, 5], [2, 4, 5, 7]]
    assert (table[0, 4:] == -1).all()
    assert num_tiles(9, 3, 2) == 8  # the grid's bound: 5 full tiles + one partial per slot
    with pytest.raises(ValueError, match=r"token slots must be in \[-1, 3\)"):
        plan_tiles(np.array([0, 3]), 3, 8)


def _factors(
    slices: tuple[int, ...], max_loras: int, max_rank: int, in_features: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """a_all and b_all as the slots hold them: slot l at rank max_rank - 3 l, zero past it."""
    g = torch.Generator().manual_seed(sum(slices) + max_rank)
    num_slices = len(slices)
    a_all = torch.randn(max_loras, num_slices, max_rank, in_features, generator=g)
    b_all = torch.randn(sum(slices), max_loras, max_rank, generator=g)
    for slot in range(max_loras):
        rank = max(1, max_rank - 3 * slot)
        a_all[slot, :, rank:] = 0
        b_all[:, slot, rank:] = 0
    return a_all.view(-1, in_features).to(dtype), b_all.view(sum(slices), -1).to(dtype)


@pytest.mark.parametrize(
    ("slices", "max_rank", "num_tokens", "split_k", "dtype"),
    [
        ((24, 8, 8), 8, 50, 2, torch.float32),  # q/k/v, several tiles per slot, K split in two
        ((20, 20), 8, 37, 1, torch.bfloat16),  # gate/up, bf16 (loaded, then fp32 math)
        ((24, 8, 8), 8, 3, None, torch.float32),  # a decode-shaped step: a few tokens
        # one wide slice (two groups of column blocks) of a rank past one block of u
        ((600,), 80, 20, 1, torch.float32),
    ],
)
def test_kernels_match_the_reference(
    slices: tuple[int, ...],
    max_rank: int,
    num_tokens: int,
    split_k: int | None,
    dtype: torch.dtype,
) -> None:
    max_loras, in_features = 3, 150
    a_all, b_all = _factors(slices, max_loras, max_rank, in_features, dtype)
    g = torch.Generator().manual_seed(num_tokens)
    token_slots = torch.randint(-1, max_loras, (num_tokens,), generator=g)
    token_slots[:2] = torch.tensor([-1, 1])  # some token has no adapter, some has one
    x = torch.randn(num_tokens, in_features, generator=g).to(dtype)
    tiles = TokenTiles(64, max_loras, CPU, tile_tokens=16)
    tiles.write(token_slots.numpy())

    u_parts = lora_shrink(x, a_all, tiles, len(slices), max_rank, split_k=split_k)
    if split_k is not None:
        assert u_parts.shape[0] == split_k
    expected_u = lora_shrink_reference(x, a_all, token_slots, len(slices), max_rank)
    has = token_slots >= 0
    torch.testing.assert_close(u_parts.sum(0)[has], expected_u[has], rtol=1e-5, atol=1e-4)

    y0 = torch.randn(num_tokens, sum(slices), generator=g).to(dtype)
    got, expected = y0.clone(), y0.clone()
    lora_expand(got, u_parts, b_all, tiles, slice_bounds(slices, CPU), max(slices))
    lora_expand_reference(expected, expected_u, b_all, token_slots, slices)
    tolerance = {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else {}
    torch.testing.assert_close(got, expected, **tolerance)
    assert not torch.equal(got[has], y0[has])  # the adapters added something
    assert torch.equal(got[~has], y0[~has])  # tokens without an adapter: untouched, exactly


def test_reference_is_each_tokens_own_adapter() -> None:
    """The reference itself against the per-token formula y = W x + B_l A_l x, slice by slice."""
    slices, max_loras, max_rank, in_features = (6, 2, 2), 2, 4, 5
    a_all, b_all = _factors(slices, max_loras, max_rank, in_features, torch.float32)
    token_slots = torch.tensor([1, -1, 0, 1])
    x = torch.randn(4, in_features, generator=torch.Generator().manual_seed(1))
    y = torch.zeros(4, sum(slices))
    u = lora_shrink_reference(x, a_all, token_slots, len(slices), max_rank)
    lora_expand_reference(y, u, b_all, token_slots, slices)
    a = a_all.view(max_loras, len(slices), max_rank, in_features)
    b = b_all.view(sum(slices), max_loras, max_rank)
    for t, slot in enumerate(token_slots.tolist()):
        start, want = 0, torch.zeros(sum(slices))
        for index, size in enumerate(slices):
            if slot >= 0:
                want[start : start + size] = b[start : start + size, slot] @ (a[slot, index] @ x[t])
            start += size
        torch.testing.assert_close(y[t], want)


def test_a_stale_plan_stays_within_the_rows() -> None:
    """A graph's warm-up runs on the plan of an earlier, longer step: its tokens past the rows
    are left out (no read or write out of bounds), the others run their slots."""
    slices, max_loras, max_rank, in_features = (16, 16), 2, 4, 20
    a_all, b_all = _factors(slices, max_loras, max_rank, in_features, torch.float32)
    token_slots = torch.tensor([1, 0, -1, 1] * 10)
    tiles = TokenTiles(64, max_loras, CPU, tile_tokens=16)
    tiles.write(token_slots.numpy())
    x = torch.randn(6, in_features, generator=torch.Generator().manual_seed(2))
    got, expected = torch.zeros(6, 32), torch.zeros(6, 32)
    u_parts = lora_shrink(x, a_all, tiles, 2, max_rank)
    lora_expand(got, u_parts, b_all, tiles, slice_bounds(slices, CPU), 16)
    u = lora_shrink_reference(x, a_all, token_slots, 2, max_rank)
    lora_expand_reference(expected, u, b_all, token_slots, slices)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
