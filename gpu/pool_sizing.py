"""How many KV blocks each pool gets when the config does not say (num_kv_blocks, num_cpu_blocks).

    device pool, CUDA   what fits in gpu_memory_utilization of the device after the weights and
                        the profiled activation peak of a max_num_batched_tokens forward
    device pool, CPU    what the config can use: max_num_seqs sequences of max_model_len tokens
                        (no lookahead: the CPU does not overlap), capped at CPU_POOL_MAX_BYTES
                        and a quarter of the machine's RAM
    swap pool           none under preemption_mode="recompute" (never swapped to); on CUDA
                        cpu_swap_gib of pinned memory; on the CPU no more than the device pool
                        (swapped blocks are ones the device pool held) nor cpu_swap_gib

On the CPU both pools are ordinary RAM that the OS commits page by page as blocks are first
written (kv_cache.KVCache does not zero them), so the sizes above bound what a busy engine
can take, and an idle or small one holds little.
"""

from __future__ import annotations

import gc
import math
import os

import torch
from troupe.config import EngineConfig
from troupe.gpu.model_config import ModelConfig

CPU_POOL_MAX_BYTES = 2 * 2**30


def block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block across all layers: the per-token cache size is all it asks of the
    model (key and value heads, or MLA's one latent vector)."""
    elem: int = torch.empty((), dtype=dtype).element_size()
    return config.num_layers * block_size * config.kv_values_per_token * elem


def cpu_pool_cap_bytes() -> int:
    """The most a default CPU device pool may take: 2 GiB, or a quarter of the RAM if less."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(CPU_POOL_MAX_BYTES, ram // 4)


def cpu_device_blocks(
    model_config: ModelConfig,
    config: EngineConfig,
    dtype: torch.dtype,
    *,
    max_model_len: int,
) -> int:
    """Device pool on the CPU: every running sequence at full length, capped (above)."""
    per_seq = math.ceil(max_model_len / config.block_size)
    need = config.max_num_seqs * per_seq
    cap = cpu_pool_cap_bytes() // block_bytes(model_config, config.block_size, dtype)
    return max(1, min(need, cap))


def swap_pool_blocks(
    model_config: ModelConfig,
    config: EngineConfig,
    dtype: torch.dtype,
    device: torch.device,
    *,
    num_gpu_blocks: int,
) -> int:
    """The CPU swap pool: see the module docstring."""
    if config.preemption_mode == "recompute":
        return 0
    by_gib = int(config.cpu_swap_gib * 2**30) // block_bytes(model_config, config.block_size, dtype)
    return by_gib if device.type == "cuda" else min(num_gpu_blocks, by_gib)


def blocks_from_free_memory(
    config: ModelConfig,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    gpu_memory_utilization: float,
    peak_activation_bytes: int,
    *,
    extra_block_bytes: int = 0,
) -> int:
    """Blocks that fit in utilization x total, after what is in use and the profiled peak.

    Call after a profiling forward at max_num_batched_tokens (peak_activation_bytes is that
    forward's peak minus what stays allocated). `extra_block_bytes`: what each block id costs
    besides (a draft model's pool has a block per id: gpu/draft_runner.py).
    """
    # memory torch's caching allocator holds but no tensor uses (an engine closed earlier in
    # this process, the profiling forward's temporaries) would count as in use; so would the
    # tensors of a closed engine that only a reference cycle keeps (its actors and runner
    # refer to each other) until the cyclic collector runs: collect first
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    in_use = total - free
    budget = int(total * gpu_memory_utilization) - in_use - peak_activation_bytes
    num_blocks = budget // (block_bytes(config, block_size, dtype) + extra_block_bytes)
    if num_blocks < 1:
        raise MemoryError(
            f"no device memory left for the KV cache: {in_use / 2**30:.1f} GiB in use and a "
            f"{peak_activation_bytes / 2**30:.1f} GiB activation peak of {total / 2**30:.1f} GiB; "
            "lower max_num_batched_tokens, raise gpu_memory_utilization, or set num_kv_blocks"
        )
    return int(num_blocks)
