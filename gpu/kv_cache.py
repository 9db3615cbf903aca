"""The paged KV pools: per-layer device caches and the CPU swap pool, plus pool sizing.

Layout, one tensor per pool so a swap is one gather + one scatter for all layers:

    pool[layer, 0 = key | 1 = value, block, offset in block, kv head, head_dim]

`pool[l, 0]` is layer l's k_cache [num_blocks, block_size, Hkv, D], contiguous as the kernels
expect.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from troupe.gpu.model_config import ModelConfig

CPU_DEFAULT_TOKENS_PER_SEQ = 2048
CPU_DEFAULT_MAX_BYTES = 2 * 1024**3


def block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block across all layers (key and value)."""
    elem: int = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.kv_size * elem


def default_cpu_device_blocks(
    config: ModelConfig, block_size: int, dtype: torch.dtype, max_num_seqs: int
) -> int:
    """Device pool size on the CPU: max_num_seqs x 2048 tokens, capped at 2 GiB."""
    wanted = max_num_seqs * CPU_DEFAULT_TOKENS_PER_SEQ // block_size
    cap = CPU_DEFAULT_MAX_BYTES // block_bytes(config, block_size, dtype)
    return max(1, min(wanted, cap))


def blocks_from_free_memory(
    config: ModelConfig,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    gpu_memory_utilization: float,
    peak_activation_bytes: int,
) -> int:
    """Blocks that fit in utilization x total, after what is in use and the profiled peak.

    Call after a profiling forward at max_num_batched_tokens (peak_activation_bytes is that
    forward's peak minus what stays allocated).
    """
    free, total = torch.cuda.mem_get_info(device)
    in_use = total - free
    budget = int(total * gpu_memory_utilization) - in_use - peak_activation_bytes
    num_blocks = budget // block_bytes(config, block_size, dtype)
    if num_blocks < 1:
        raise MemoryError(
            f"no device memory left for the KV cache: {in_use / 2**30:.1f} GiB in use and a "
            f"{peak_activation_bytes / 2**30:.1f} GiB activation peak of {total / 2**30:.1f} GiB; "
            "lower max_num_batched_tokens, raise gpu_memory_utilization, or set num_kv_blocks"
        )
    return int(num_blocks)


class KVCache:
    """Device pool (per-layer views for the model) and the CPU swap pool."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (
            config.num_layers,
            2,
            num_gpu_blocks,
            block_size,
            config.num_kv_heads,
            config.head_dim,
        )
        try:
            # zeros, not empty: padded decode rows read block 0, and garbage could be NaN
            self.gpu = torch.zeros(shape, dtype=dtype, device=device)
        except torch.OutOfMemoryError as exc:
            raise MemoryError(
                f"cannot allocate {num_gpu_blocks} KV blocks "
                f"({num_gpu_blocks * block_bytes(config, block_size, dtype) / 2**30:.1f} GiB); "
                "lower num_kv_blocks or gpu_memory_utilization"
            ) from exc
        cpu_shape = (config.num_layers, 2, num_cpu_blocks, *shape[3:])
        pin = device.type == "cuda"
        self.cpu = torch.zeros(cpu_shape, dtype=dtype, device="cpu", pin_memory=pin)
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.block_size = block_size
        self.device = device
        self.layers = [(self.gpu[i, 0], self.gpu[i, 1]) for i in range(config.num_layers)]

    def swap_out(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy (gpu block, cpu block) pairs device -> CPU, all layers in one batched copy."""
        if not pairs:
            return
        gpu_ids, cpu_ids = self._indices(pairs)
        moved = self.gpu.index_select(2, gpu_ids.to(self.device)).to("cpu")
        self.cpu.index_copy_(2, cpu_ids, moved)

    def swap_in(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy (cpu block, gpu block) pairs CPU -> device, all layers in one batched copy."""
        if not pairs:
            return
        cpu_ids, gpu_ids = self._indices(pairs)
        moved = self.cpu.index_select(2, cpu_ids)
        if self.device.type == "cuda":
            moved = moved.pin_memory().to(self.device, non_blocking=True)
        self.gpu.index_copy_(2, gpu_ids.to(self.device), moved)

    def _indices(self, pairs: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2)
        return ids[:, 0].contiguous(), ids[:, 1].contiguous()
