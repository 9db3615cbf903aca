"""Compile the MLA decode sweep's configs for sm_90 without a GPU and print what each became.

    python3 -m troupe.ops.mla_compile_check [--rows 256] [--context 1024]

For every ops/mla_variant_sweep.CONFIGS entry at the split count it picks for the shape (132
SMs), Triton (ahead of time, its bundled ptxas; pointer and stride arguments marked 16-byte
divisible as the JIT does for aligned tensors) prints: shared memory, registers per thread and
spill stack (cuobjdump), wgmma ops in the TTGIR, cp.async copies, and the shared buffers of the
latent tile ("2x64x512": two tiles of 64 rows, load and compute overlap; "1x...": they do not).
Programs per SM follow from registers (65,536 per SM) and shared memory (227 KB). No timing:
which config is fastest is the H200 sweep's question (python3 -m troupe.ops.mla_bench
--sweep-variants). Written against triton 3.7's ASTSource.
"""

from __future__ import annotations

import argparse
import re

from troupe.kernels.mla_decode import MlaLaunch, choose_num_splits
from troupe.kernels.mla_decode_paged import mla_split_paged_kernel
from troupe.ops.mla_variant_sweep import CONFIGS
from troupe.ops.sm90_compile import compile_sm90

_TYPES = {"qk_scale": "fp32", "block_tables_ptr": "*i32", "row_seq_ptr": "*i32",
          "row_ctx_ptr": "*i32", "counter_ptr": "*i32", "part_lse_ptr": "*fp32"}  # fmt: skip


def compile_config(config: MlaLaunch, splits: int) -> dict[str, object]:
    kernel = mla_split_paged_kernel
    consts = {"NUM_HEADS": 16, "BLOCK_SIZE": 16, "LATENT": 512, "ROPE": 64, "BLOCK_H": 16,
              "BLOCK_L": 512, "BLOCK_R": 64, "BLOCK_N": config.block_n, "NUM_SPLITS": splits,
              "PRECISION": "tf32"}  # fmt: skip
    build = compile_sm90(kernel, consts, _TYPES, config.num_warps, config.num_stages)
    ttgir = build.ttgir
    tiles = re.findall(r"local_alloc : \(\) -> !ttg.memdesc<(\d+)x(\d+)x512xbf16", ttgir)
    return {
        "smem": build.smem,
        "regs": build.regs,
        "stack": build.stack,
        "wgmma": ttgir.count("warp_group_dot "),
        "cp.async": ttgir.count("async_copy_global_to_local"),
        "tile buffers": ",".join(f"{n}x{m}x512" for n, m in tiles) or "registers",
        "per SM": build.programs_per_sm(config.num_warps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--context", type=int, default=1024)
    args = parser.parse_args()
    for config in dict.fromkeys(CONFIGS):
        splits = choose_num_splits(args.rows, 1, args.context, 132, config.programs_per_sm)
        head = (f"bn={config.block_n:<3} w={config.num_warps} st={config.num_stages} "
                f"splits={splits:<2}")  # fmt: skip
        try:
            info = compile_config(config, splits)
        except Exception as exc:  # report and go on
            print(f"{head}  FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
            continue
        print(f"{head}  " + "  ".join(f"{k} {v}" for k, v in info.items()))


if __name__ == "__main__":
    main()
