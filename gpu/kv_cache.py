"""The paged KV pools: per-layer device caches and the CPU swap pool (sizes: pool_sizing.py).

Layout, one tensor per pool so a swap is one gather + one scatter for all layers:

    pool[layer, 0 = key | 1 = value, block, offset in block, kv head, head_dim]
    pool[layer, 0 = latent, block, offset in block, 1, kv_lora_rank + rope dim]     MLA

`pool[l, 0]` is layer l's k_cache [num_blocks, block_size, Hkv, D], contiguous as the kernels
expect; an MLA model's layer gets its one latent cache as (cache, cache) (gpu/mla_layer.py). The
planes, heads and width come from ModelConfig.kv_cache_*: nothing else here knows the model. An fp8 pool is stored as bytes (torch has no fp8 index_select for the swaps) and viewed
as e4m3 for the model; its scales, [layer, k | v, kv head] fp32, stay on the device (set at the
first write, kernels/kv_quant.py), so a swap moves the blocks' bytes alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.pool_sizing import block_bytes
from troupe.kernels.kv_quant import FP8_DTYPE

if TYPE_CHECKING:
    from troupe.gpu.runner_setup import RunnerOptions


def kv_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV pools' element type: e4m3 for "fp8", else the model's."""
    return FP8_DTYPE if kv_cache_dtype == "fp8" else model_dtype


class KVCache:
    """Device pool (per-layer views for the model) and the CPU swap pool (allocated lazily)."""

    @classmethod
    def for_options(
        cls,
        config: ModelConfig,
        options: RunnerOptions,
        model_dtype: torch.dtype,
        device: torch.device,
    ) -> KVCache:
        """The pools of a runner built with `options` (options.kv_cache_dtype: "auto" is the
        model's dtype)."""
        return cls(
            config,
            num_gpu_blocks=options.num_gpu_blocks,
            num_cpu_blocks=options.num_cpu_blocks,
            block_size=options.block_size,
            dtype=kv_dtype(options.kv_cache_dtype, model_dtype),
            device=device,
        )

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
            config.kv_cache_planes,
            num_gpu_blocks,
            block_size,
            config.kv_cache_heads,
            config.kv_cache_head_dim,
        )
        # CUDA: zeros, not empty: CUDA-graph padding rows read block 0, and garbage could be
        # NaN. CPU: empty, so the OS commits a page when a block is first written and an
        # engine holds the RAM it uses, not the whole pool; no op reads a slot before it is
        # written there (the torch ops gather exactly seq_len tokens or mask the rest).
        alloc = torch.zeros if device.type == "cuda" else torch.empty
        is_fp8 = dtype == FP8_DTYPE
        if is_fp8 and config.mla is not None:
            raise ValueError(
                "kv_cache_dtype 'fp8' is not supported for latent attention (MLA) models; "
                "use kv_cache_dtype 'auto'"
            )
        store = torch.uint8 if is_fp8 else dtype
        try:
            self.gpu = alloc(shape, dtype=store, device=device)
        except torch.OutOfMemoryError as exc:
            raise MemoryError(
                f"cannot allocate {num_gpu_blocks} KV blocks "
                f"({num_gpu_blocks * block_bytes(config, block_size, dtype) / 2**30:.1f} GiB); "
                "lower num_kv_blocks or gpu_memory_utilization"
            ) from exc
        # On the CPU the swap pool is allocated at the first swap-out: most engines never
        # preempt. On CUDA it is pinned (committed and zeroed when allocated): allocated now, so
        # the first preemption under load does not stall on it.
        self._cpu_shape = (config.num_layers, shape[1], num_cpu_blocks, *shape[3:])
        self._cpu: torch.Tensor | None = None
        self._dtype = store
        self._num_bytes = self.gpu.untyped_storage().nbytes()  # kept across free()
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.block_size = block_size
        self.device = device
        view = self.gpu.view(dtype)
        last = config.kv_cache_planes - 1
        self.layers = [(view[i, 0], view[i, last]) for i in range(config.num_layers)]
        # fp8: 0 = unset; the first write sets each (kernels/kv_quant.update_kv_scales)
        self.scales = (
            torch.zeros(config.num_layers, 2, config.num_kv_heads, device=device)
            if is_fp8
            else None
        )
        if device.type == "cuda":
            _ = self.cpu
            self._stage = torch.empty(0, dtype=store, pin_memory=True)
            self._staged = torch.cuda.Event()  # type: ignore[no-untyped-call]

    def free(self) -> int:
        """Give both pools' memory back (sleep mode, gpu/sleep_mode.py): the device pool's
        storage shrinks to nothing (every per-layer view keeps its identity and shape), the swap
        pool and staging buffer are dropped. Their contents are gone. The bytes freed."""
        storage = self.gpu.untyped_storage()
        freed = storage.nbytes() + self.swap_pool_bytes
        storage.resize_(0)
        self._cpu = None
        if self.device.type == "cuda":
            self._staged.synchronize()
            self._stage = torch.empty(0, dtype=self._dtype, pin_memory=True)
        return freed

    def reallocate(self) -> None:
        """The pools again after free(), the same size, as __init__ makes them (the storage
        lives at a new address: CUDA graphs that read the old one are captured again)."""
        self.gpu.untyped_storage().resize_(self._num_bytes)
        if self.device.type == "cuda":
            self.gpu.zero_()  # as at start: graph padding rows read block 0
            _ = self.cpu

    def reset_scales(self) -> None:
        """Unset the fp8 scales (after warm-up forwards over made-up data)."""
        if self.scales is not None:
            self.scales.zero_()

    @property
    def cpu(self) -> torch.Tensor:
        """The swap pool [layers, planes, num_cpu_blocks, block_size, heads, D], made on first
        use."""
        if self._cpu is None:
            pin = self.device.type == "cuda"
            alloc = torch.zeros if pin else torch.empty  # as the device pool: see __init__
            self._cpu = alloc(self._cpu_shape, dtype=self._dtype, device="cpu", pin_memory=pin)
        return self._cpu

    @property
    def swap_pool_bytes(self) -> int:
        """Bytes the swap pool holds now: 0 until the first swap-out."""
        return 0 if self._cpu is None else self._cpu.numel() * self._cpu.element_size()

    def swap_out(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy (gpu block, cpu block) pairs device -> CPU, all layers in one batched copy."""
        if not pairs:
            return
        gpu_ids, cpu_ids = self._indices(pairs)
        moved = self.gpu.index_select(2, gpu_ids.to(self.device))
        if self.device.type == "cuda":  # into pinned staging: no pageable bounce
            moved = self._staging(len(pairs)).copy_(moved)
        self.cpu.index_copy_(2, cpu_ids, moved)

    def swap_in(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy (cpu block, gpu block) pairs CPU -> device, all layers in one batched copy."""
        if not pairs:
            return
        cpu_ids, gpu_ids = self._indices(pairs)
        if self.device.type == "cuda":  # gathered into pinned staging, then one async copy
            staged = torch.index_select(self.cpu, 2, cpu_ids, out=self._staging(len(pairs)))
            moved = staged.to(self.device, non_blocking=True)
            self._staged.record()  # the staging buffer is free again once this copy is done
        else:
            moved = self.cpu.index_select(2, cpu_ids)
        self.gpu.index_copy_(2, gpu_ids.to(self.device), moved)

    def _staging(self, num_blocks: int) -> torch.Tensor:
        """A pinned [layers, planes, num_blocks, ...] buffer, kept and grown (pinning memory
        per swap costs more than the copy), once its last asynchronous copy is done."""
        shape = (self._cpu_shape[0], self._cpu_shape[1], num_blocks, *self._cpu_shape[3:])
        numel = math.prod(shape)
        if self._stage.numel() < numel:
            self._stage = torch.empty(2 * numel, dtype=self._dtype, pin_memory=True)
        self._staged.synchronize()
        return self._stage[:numel].view(shape)

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy (src, dst) device blocks, all layers, K and V, in one gather + one scatter
        (parallel sampling's copy on write of a prompt's last, partial block)."""
        if not pairs:
            return
        src, dst = self._indices(pairs)
        device = self.device
        self.gpu.index_copy_(2, dst.to(device), self.gpu.index_select(2, src.to(device)))

    def _indices(self, pairs: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2)
        return ids[:, 0].contiguous(), ids[:, 1].contiguous()
