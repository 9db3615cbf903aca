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
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from troupe.kernels.mla_decode import MlaLaunch, choose_num_splits
from troupe.kernels.mla_decode_paged import mla_split_paged_kernel
from troupe.ops.mla_variant_sweep import CONFIGS

_TYPES = {"qk_scale": "fp32", "block_tables_ptr": "*i32", "row_seq_ptr": "*i32",
          "row_ctx_ptr": "*i32", "counter_ptr": "*i32", "part_lse_ptr": "*fp32"}  # fmt: skip
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_config(config: MlaLaunch, splits: int) -> dict[str, object]:
    kernel = mla_split_paged_kernel
    consts = {"NUM_HEADS": 16, "BLOCK_SIZE": 16, "LATENT": 512, "ROPE": 64, "BLOCK_H": 16,
              "BLOCK_L": 512, "BLOCK_R": 64, "BLOCK_N": config.block_n, "NUM_SPLITS": splits,
              "PRECISION": "tf32"}  # fmt: skip
    names = kernel.arg_names
    signature = {
        n: "constexpr" if n in consts else _TYPES.get(n, "*bf16" if n.endswith("_ptr") else "i32")
        for n in names
    }
    aligned = [i for i, n in enumerate(names) if n.endswith("_ptr") or n.startswith("stride")]
    src = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(names.index(k),): v for k, v in consts.items()},
        attrs={(i,): [["tt.divisibility", 16]] for i in aligned},
    )
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    ttgir = compiled.asm["ttgir"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([os.path.join(_BIN, "cuobjdump"), "-res-usage", f.name],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
    found = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    tiles = re.findall(r"local_alloc : \(\) -> !ttg.memdesc<(\d+)x(\d+)x512xbf16", ttgir)
    regs, smem = int(found.group(1)) if found else 255, int(compiled.metadata.shared)
    return {
        "smem": smem,
        "regs": regs,
        "stack": int(stack.group(1)) if stack else -1,
        "wgmma": ttgir.count("warp_group_dot "),
        "cp.async": ttgir.count("async_copy_global_to_local"),
        "tile buffers": ",".join(f"{n}x{m}x512" for n, m in tiles) or "registers",
        "per SM": min(65536 // (regs * 32 * config.num_warps), 232448 // max(smem, 1)),
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
