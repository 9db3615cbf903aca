"""write_kv scatters each token's [Hkv, D] to its slot and leaves every other slot untouched."""

from __future__ import annotations

import pytest
import torch
from troupe.kernels import reference
from troupe.kernels.ops import KernelOps

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_kv_heads,head_dim", [(1, 8), (3, 16), (2, 24)])
def test_write_kv_matches_reference(
    device: str, num_kv_heads: int, head_dim: int, triton_ops: KernelOps
) -> None:
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = torch.Generator().manual_seed(num_kv_heads * 100 + head_dim)
    num_blocks, block_size, num_tokens = 5, 4, 11
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 7]] = -1  # padding tokens: skipped
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    slots = slots.to(device)

    triton_ops.write_kv(key, value, k_cache, v_cache, slots)
    reference.write_kv(key, value, k_ref, v_ref, slots)

    torch.testing.assert_close(k_cache, k_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, v_ref, rtol=0, atol=0, equal_nan=True)
    written = (~k_cache.isnan()).all(dim=(2, 3)).sum().item()
    assert written == num_tokens - 2
    # Spot-check one token against its slot by hand.
    slot = int(slots[0])
    torch.testing.assert_close(k_cache[slot // block_size, slot % block_size], key[0])


def test_write_kv_reference_skips_negative_slots() -> None:
    k_cache = torch.zeros(2, 2, 1, 4) + 5.0
    v_cache = k_cache.clone()
    key = torch.arange(8.0).view(2, 1, 4)
    reference.write_kv(key, -key, k_cache, v_cache, torch.tensor([3, -1]))
    assert k_cache[1, 1, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert v_cache[1, 1, 0].tolist() == [0.0, -1.0, -2.0, -3.0]
    assert (k_cache.view(4, 4)[:3] == 5.0).all()
