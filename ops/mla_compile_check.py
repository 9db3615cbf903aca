"""Compile the MLA decode sweep's configs for sm_90 without a GPU and print what each became.

    python3 -m troupe.ops.mla_compile_check [--rows 256] [--context 1024] [--variant paged]

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
from troupe.kernels.mla_decode import (
    SPLIT_KERNELS,
    MlaLaunch,
    MlaVariant,
    choose_num_splits,
)
from troupe.kernels.mla_decode_tma import mla_split_tma_kernel
from troupe.ops.mla_variant_sweep import CONFIGS

_TYPES = {"qk_scale": "fp32", "block_tables_ptr": "*i32", "row_seq_ptr": "*i32",
          "row_ctx_ptr": "*i32", "counter_ptr": "*i32", "part_lse_ptr": "*fp32"}  # fmt: skip
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_config(config: MlaLaunch, splits: int) -> dict[str, object]:
    kernel = SPLIT_KERNELS.get(config.variant, mla_split_tma_kernel)
    consts = {"NUM_HEADS": 16, "BLOCK_SIZE": 16, "LATENT": 512, "ROPE": 64, "BLOCK_H": 16,
              "BLOCK_L": 512, "BLOCK_R": 64, "BLOCK_N": config.block_n, "NUM_SPLITS": splits,
              "PRECISION": "tf32", "FUSED_MERGE": config.fused_merge and splits > 1,
              "PREFETCH": config.prefetch}  # fmt: skip
    if config.variant is MlaVariant.TMA:
        for gone in ("BLOCK_L", "BLOCK_N", "PREFETCH"):
            del consts[gone]
        consts.update(PIECE=256, IDS_AHEAD=config.ids_ahead)
    if config.variant is MlaVariant.PAGED:
        consts.update(IDS_AHEAD=config.ids_ahead, Q_RELOAD=config.q_reload,
                      COL_PARTS=config.col_parts)  # fmt: skip
        consts["FUSED_MERGE"] = consts["FUSED_MERGE"] and config.col_parts == 1
    names = kernel.arg_names
    part = "*bf16" if config.half_partials else "*fp32"
    signature = {
        n: "constexpr" if n in consts else _TYPES.get(n, part if n == "part_out_ptr" else
                                                     "*bf16" if n.endswith("_ptr") else "i32")
        for n in names
    }  # fmt: skip
    signature.update(
        (n, f"tensordesc<bf16[16,{256 if n == 'c_desc' else 64}]>")
        for n in names if n.endswith("_desc")
    )  # fmt: skip
    aligned = [i for i, n in enumerate(names) if n.endswith("_ptr") or n.startswith("stride")]
    src = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(names.index(k),): v for k, v in consts.items()},
        attrs={(i,): [["tt.divisibility", 16]] for i in aligned},
    )
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.max_registers is not None:
        options["maxnreg"] = config.max_registers
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
    parser.add_argument("--variant", choices=[v.value for v in MlaVariant], help="only these")
    args = parser.parse_args()
    for config in dict.fromkeys(CONFIGS):
        if args.variant and config.variant.value != args.variant:
            continue
        splits = choose_num_splits(args.rows, config.column_programs(), args.context, 132,
                                   config.programs_per_sm)  # fmt: skip
        head = (f"{config.variant.value:<9} bn={config.block_n:<3} w={config.num_warps} "
                f"st={config.num_stages} splits={splits:<2} fused={int(config.fused_merge)} "
                f"prefetch={int(config.prefetch)}")  # fmt: skip
        if config.max_registers is not None:
            head += f" maxnreg={config.max_registers}"
        if config.variant is MlaVariant.PAGED:
            head += (f" ahead={int(config.ids_ahead)} reload={int(config.q_reload)} "
                     f"parts={config.col_parts}")  # fmt: skip
        try:
            info = compile_config(config, splits)
        except Exception as exc:  # report and go on
            print(f"{head}  FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
            continue
        print(f"{head}  " + "  ".join(f"{k} {v}" for k, v in info.items()))


if __name__ == "__main__":
    main()
