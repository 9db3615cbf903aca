"""Default pool sizes (gpu/pool_sizing.py): on the CPU, what the config can use, capped."""

from __future__ import annotations

import pytest
import torch
from troupe import EngineConfig
from troupe.gpu.pool_sizing import (
    block_bytes,
    blocks_from_free_memory,
    cpu_device_blocks,
    cpu_pool_cap_bytes,
    swap_pool_blocks,
)
from troupe.gpu.weights import qwen3_0_6b_config

MODEL = qwen3_0_6b_config()  # 28 layers x 8 KV heads x 128: 3.5 MiB per fp32 block of 16
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_block_bytes_counts_keys_and_values_of_every_layer() -> None:
    assert block_bytes(MODEL, 16, torch.float32) == 2 * 28 * 16 * 8 * 128 * 4
    assert block_bytes(MODEL, 16, torch.bfloat16) == 2 * 28 * 16 * 8 * 128 * 2


def test_cpu_pool_holds_every_sequence_at_full_length() -> None:
    config = EngineConfig(max_num_seqs=4, block_size=16)
    # 4 sequences x ceil(100 / 16) = 7 blocks each
    assert cpu_device_blocks(MODEL, config, torch.float32, max_model_len=100) == 28


def test_cpu_pool_is_capped() -> None:
    config = EngineConfig()  # 256 sequences
    got = cpu_device_blocks(MODEL, config, torch.float32, max_model_len=8192)
    assert 0 < cpu_pool_cap_bytes() <= 2 * 2**30
    assert got == cpu_pool_cap_bytes() // block_bytes(MODEL, 16, torch.float32) < 256 * 512


@pytest.mark.parametrize(
    ("device", "mode", "expected"),
    [
        (CPU, "auto", 28),  # no more than the device pool holds
        (CPU, "swap", 28),
        (CPU, "recompute", 0),  # never swapped to
        (CUDA, "auto", 2**30 // (2 * 28 * 16 * 8 * 128 * 2)),  # cpu_swap_gib=1, bf16
        (CUDA, "recompute", 0),
    ],
)
def test_swap_pool(device: torch.device, mode: str, expected: int) -> None:
    config = EngineConfig(preemption_mode=mode, cpu_swap_gib=1.0)  # type: ignore[arg-type]
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    assert swap_pool_blocks(MODEL, config, dtype, device, num_gpu_blocks=28) == expected


def test_cpu_swap_pool_also_bounded_by_cpu_swap_gib() -> None:
    config = EngineConfig(cpu_swap_gib=0.01)  # 10 MiB: 2 blocks of 3.5 MiB
    assert swap_pool_blocks(MODEL, config, torch.float32, CPU, num_gpu_blocks=28) == 2


@pytest.mark.gpu
def test_memory_cached_by_torch_is_free_for_the_pool() -> None:
    """What torch's caching allocator holds for no tensor (an engine closed earlier in the
    process) is not counted as in use."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")

    def blocks() -> int:
        return blocks_from_free_memory(MODEL, 16, torch.bfloat16, CUDA, 0.9, 0)

    before = blocks()
    freed = torch.empty(8 * 2**30, dtype=torch.uint8, device=CUDA)
    del freed  # cached by the allocator, not returned to the driver
    assert torch.cuda.memory_reserved(CUDA) >= 8 * 2**30  # the premise: still reserved
    after = blocks()
    # 8 GiB would be ~18,700 bf16 blocks of this model; allow other processes' small drift
    assert abs(after - before) < 200, (before, after)


@pytest.mark.gpu
def test_memory_a_reference_cycle_keeps_is_free_for_the_pool() -> None:
    """A closed engine's runner and actors refer to each other: its KV pool and weights live
    until the cyclic collector runs. A second engine opened in the same process (a benchmark's
    next scenario) must not count them as in use (it found 71.5 GiB so, 2026-12-05)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import gc

    def blocks() -> int:
        return blocks_from_free_memory(MODEL, 16, torch.bfloat16, CUDA, 0.9, 0)

    before = blocks()
    gc.disable()
    try:
        cycle: dict[str, object] = {"pool": torch.empty(8 * 2**30, dtype=torch.uint8, device=CUDA)}
        cycle["self"] = cycle
        del cycle  # only the cycle holds the 8 GiB now
        assert torch.cuda.memory_allocated(CUDA) >= 8 * 2**30  # the premise: still allocated
        after = blocks()
    finally:
        gc.enable()
    assert abs(after - before) < 200, (before, after)
