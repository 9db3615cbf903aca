"""KVCache (gpu/kv_cache.py): the swap pool is made at the first swap-out, and swaps round-trip."""

from __future__ import annotations

import torch
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.weights import qwen3_0_6b_config


def test_swap_pool_is_allocated_at_first_swap_and_round_trips() -> None:
    config = qwen3_0_6b_config()
    kv = KVCache(
        config,
        num_gpu_blocks=4,
        num_cpu_blocks=3,
        block_size=2,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    assert kv.swap_pool_bytes == 0
    kv.gpu.copy_(torch.randn_like(kv.gpu))
    before = kv.gpu.clone()
    kv.swap_out([(1, 2), (3, 0)])
    assert kv.swap_pool_bytes == 3 * before[:, :, 0].numel() * 4
    kv.gpu[:, :, 1].fill_(float("nan"))
    kv.swap_in([(2, 0), (0, 1)])  # block 1's data to block 0, block 3's to block 1
    assert torch.equal(kv.gpu[:, :, 0], before[:, :, 1])
    assert torch.equal(kv.gpu[:, :, 1], before[:, :, 3])
