"""Compile the punica LoRA kernels (kernels/lora_shrink.py, lora_expand.py) for sm_90 without a
GPU, at the launches the engine makes; print registers, spill stack, shared memory and programs
per SM for each projection of Llama-3-8B.

    python -m troupe.ops.lora_compile_check [--rank 16] [--dtype bf16]

Run it without TRITON_INTERPRET (the interpreter compiles nothing). No timing: that is
ops/lora_kernel_bench.py's, on a GPU. Triton's bundled ptxas and cuobjdump (ops/sm90_compile.py).
"""

from __future__ import annotations

import argparse

import torch
from troupe.kernels.lora_expand import NUM_WARPS as EXPAND_WARPS
from troupe.kernels.lora_expand import _expand_kernel, expand_constexprs
from troupe.kernels.lora_shrink import NUM_WARPS as SHRINK_WARPS
from troupe.kernels.lora_shrink import _shrink_kernel, shrink_constexprs
from troupe.kernels.lora_tiles import TILE_TOKENS
from troupe.ops.lora_kernel_bench import PROJECTIONS
from troupe.ops.sm90_compile import compile_sm90

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtype", choices=tuple(_DTYPES), default="bf16")
    parser.add_argument("--num-stages", type=int, default=2)
    args = parser.parse_args(argv)
    dtype, name = _DTYPES[args.dtype], args.dtype
    pointers = {"u_ptr": "*fp32", "table_ptr": "*i32", "order_ptr": "*i32", "bounds_ptr": "*i64"}
    pointers |= {p: f"*{name}" for p in ("x_ptr", "a_ptr", "y_ptr", "b_ptr")}
    print(
        f"{'kernel':8s} {'projection':10s} {'regs':>5s} {'stack':>6s} {'smem':>7s} {'per SM':>7s}"
    )
    for projection, in_features, slices in PROJECTIONS:
        width = len(slices) * args.rank
        builds = (
            ("shrink", _shrink_kernel, SHRINK_WARPS,
             shrink_constexprs(width, in_features, TILE_TOKENS, dtype, True)),
            ("expand", _expand_kernel, EXPAND_WARPS,
             expand_constexprs(args.rank, len(slices), max(slices), TILE_TOKENS, dtype, True)),
        )  # fmt: skip
        for kernel_name, kernel, warps, consts in builds:
            build = compile_sm90(kernel, dict(consts), pointers, warps, args.num_stages)
            print(
                f"{kernel_name:8s} {projection:10s} {build.regs:5d} {build.stack:6d}"
                f" {build.smem:7d} {build.programs_per_sm(warps):7d}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
