"""Which fused-MoE kernel runs, with which tiles: a typed config, and the defaults by size.

Variants (the algorithm):

    FUSED     kernels/fused_moe.py: gate/up with SiLU fused (two accumulators over one x tile,
              act [P, I] stored in x's dtype), then the down projection (today's kernel).
    SPLIT_K   kernels/moe_split_k.py: both projections split along K into split_k slices
              added atomically in fp32: gate/up is one plain GEMM over the 2I rows of w13
              into an fp32 [P, 2I] buffer, the down kernel applies silu(gate) * up as it
              loads its A tile. At decode sizes more programs per expert stream its weights;
              split_k 1 is the unfused pair (separate gate/up GEMM, SiLU in the down load).

Orthogonal knobs, both variants:
    group_m        0: 2-D grid, row blocks fastest (today's order); g >= 1: groups of g row
                   blocks x every N tile for L2 reuse of x rows (kernels/moe_tiles.py).
    atomic_reduce  FUSED: the down kernel adds each weighted row into an fp32 [T, H] output
                   instead of storing [T*k, H] per slot and summing after (SPLIT_K always).
    swap_ab        each tile computes (w @ x^T)^T, so the weight tile (block_n rows)
                   is the dot's M side and the block's 16-32 rows its N side: Hopper's wgmma
                   wants M >= 64, decode blocks have few rows (otherwise mma.sync).
    triton_align   sort the rows by expert in one Triton program (kernels/moe_align_triton.py)
                   instead of ~25 torch kernels; batches over its MAX_ROWS use torch.

The engine's fused_moe takes config_for(rows, experts): DECODE_CONFIG while an expert holds at
most DECODE_MAX_ROWS_PER_EXPERT rows on average, PREFILL_CONFIG above. Switching the default
after a sweep (python -m troupe.ops.moe_bench --sweep-variants) is one line each below.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields, replace

import torch


class MoeVariant(enum.Enum):
    FUSED = "fused"
    SPLIT_K = "split_k"


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True)
class MoeKernelConfig:
    """One fused-MoE launch: variant, tiles (block_m None: by rows per expert) and Triton's
    num_warps / num_stages."""

    variant: MoeVariant = MoeVariant.FUSED
    block_m: int | None = None
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 0  # 0: 2-D grid; else row blocks per group of the 1-D grid
    split_k: int = 1  # SPLIT_K: K slices per projection
    atomic_reduce: bool = False
    swap_ab: bool = False
    triton_align: bool = False

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if not _power_of_two(value) or value < 16:
                raise ValueError(
                    f"MoeKernelConfig.{name} must be a power of two >= 16, got {value}"
                )
        if self.block_m is not None and (not _power_of_two(self.block_m) or self.block_m < 16):
            raise ValueError(
                f"MoeKernelConfig.block_m must be None or a power of two >= 16, got {self.block_m}"
            )
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(
                f"MoeKernelConfig.num_warps must be 1-16 (power of two), got {self.num_warps}"
            )
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"MoeKernelConfig.num_stages must be in 1..8, got {self.num_stages}")
        if self.group_m < 0:
            raise ValueError(f"MoeKernelConfig.group_m must be >= 0, got {self.group_m}")
        if self.split_k < 1:
            raise ValueError(f"MoeKernelConfig.split_k must be >= 1, got {self.split_k}")
        if self.split_k > 1 and self.variant is not MoeVariant.SPLIT_K:
            raise ValueError("MoeKernelConfig.split_k > 1 needs variant SPLIT_K")

    def label(self) -> str:
        """Short form for tables: bm/bn/bk w s and the variant's own knobs."""
        bm = "auto" if self.block_m is None else str(self.block_m)
        text = f"{bm}/{self.block_n}/{self.block_k} w{self.num_warps} s{self.num_stages}"
        if self.group_m:
            text += f" g{self.group_m}"
        if self.variant is MoeVariant.SPLIT_K:
            text += f" k{self.split_k}"
        elif self.atomic_reduce:
            text += " atomic"
        if self.swap_ab:
            text += " swap"
        if self.triton_align:
            text += " talign"
        return text


def config_source(config: MoeKernelConfig) -> str:
    """config as the Python that builds it (its non-default fields), for the one-line switch."""
    parts = [f"MoeVariant.{config.variant.name}"]
    for field in fields(config)[1:]:
        value = getattr(config, field.name)
        if value != field.default:
            parts.append(f"{field.name}={value!r}")
    return f"MoeKernelConfig({', '.join(parts)})"


def block_m_for(num_rows: int, num_experts: int) -> int:
    """Rows per program: one block should hold most experts' rows at decode sizes (each block
    rereads its expert's weights; the counts vary around the mean), GEMM tiles at prefill."""
    per_expert = num_rows / num_experts
    return 16 if per_expert <= 8 else 32 if per_expert <= 18 else 64


DECODE_MAX_ROWS_PER_EXPERT = 32
# The defaults the engine runs: change these two lines to the sweep's BEST rows.
# H200 sweep, 2026-12-02 (docs/benchmarks.md): DeepSeek-V2-Lite 256 tokens 77% of copy (was 26%),
# 16,384 tokens 476 TFLOP/s (was 314); Qwen3-30B-A3B 67% (40%) and 416 TFLOP/s (293)
DECODE_CONFIG = MoeKernelConfig(
    MoeVariant.FUSED, block_m=32, block_k=128, num_stages=4, swap_ab=True, triton_align=True
)
PREFILL_CONFIG = MoeKernelConfig(MoeVariant.FUSED, block_m=128, block_n=128, num_warps=8, group_m=1)


# Shared memory the pipelined tiles of one program may take (H100/H200 allow 227 KiB)
SHARED_MEMORY_BUDGET = 200 * 1024


def shared_bytes(config: MoeKernelConfig, block_m: int, elem_size: int) -> int:
    """The gate/up kernel's pipelined tiles: per stage an x tile and two weight tiles."""
    return (block_m + 2 * config.block_n) * config.block_k * elem_size * config.num_stages


def fitted(config: MoeKernelConfig, block_m: int, elem_size: int) -> MoeKernelConfig:
    """config with num_stages (then block_k) lowered until its tiles fit SHARED_MEMORY_BUDGET:
    the sweep picked its tiles in bf16, and fp32 inputs (the CUDA tests against HF) need twice
    the bytes."""
    while shared_bytes(config, block_m, elem_size) > SHARED_MEMORY_BUDGET:
        if config.num_stages > 2:
            config = replace(config, num_stages=config.num_stages - 1)
        elif config.block_k > 32:
            config = replace(config, block_k=config.block_k // 2)
        else:
            break
    return config


def config_for(num_rows: int, num_experts: int, elem_size: int = 2) -> MoeKernelConfig:
    """The engine's config for num_rows = tokens * top_k (token, expert) rows of elem_size-byte
    inputs."""
    config = (
        DECODE_CONFIG if num_rows <= DECODE_MAX_ROWS_PER_EXPERT * num_experts else PREFILL_CONFIG
    )
    return fitted(config, config.block_m or block_m_for(num_rows, num_experts), elem_size)


def precision_for(dtype: torch.dtype) -> str:
    """tl.dot's input precision: exact fp32 for fp32 inputs (the CPU tests), native otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"
