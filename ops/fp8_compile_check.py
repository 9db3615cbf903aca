"""Compile the fp8 decode kernel's sweep candidates for sm_90 without a GPU; print what each became.

    python3 -m troupe.ops.fp8_compile_check [--sass DIR]

For every fp8 candidate of ops/fp8_variant_sweep.CANDIDATES (Llama-3.1-8B heads, block_size 16,
one split): registers per thread, spill stack, shared memory, programs per SM those allow, and
the SASS instructions of the main loop that tell how the fp8 tile reaches the tensor cores: byte
reads of shared memory (LDS.U8, the mma-layout path), ldmatrix (LDSM), cp.async (LDGSTS), global
loads (LDG), conversions (F2FP), HMMA / HGMMA (wgmma), the loop's length and warp instructions
per KV byte (today's default 0.125; at 90% of copy an H200 SM must take 16.5 KV bytes a cycle
from 4 schedulers: ~0.24 instructions a byte at full issue, so lower is the aim). The first
line is the bf16-cache kernel at its default launch for calibration: 99% of copy on the H200 at
~0.054 instructions per (bf16) byte. --sass DIR also writes each kernel's SASS.
No timing: that is the H200 sweep's question (python -m troupe.ops.fp8_kv_bench attention
--sweep-variants). Triton's bundled ptxas and cuobjdump; pointers marked 16-byte divisible.
"""

from __future__ import annotations

import argparse
import os
import re

from troupe.kernels import decode_attention
from troupe.kernels.decode_attention import DecodeConfig
from troupe.kernels.decode_attention_fp8 import decode_split_fp8_kernel, kernel_constexprs
from troupe.ops.fp8_variant_sweep import CANDIDATES
from troupe.ops.sm90_compile import compile_sm90

_TYPES = {"qk_scale": "fp32", "cap": "fp32", "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv",
          "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "k_scale_ptr": "*fp32",
          "v_scale_ptr": "*fp32", "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32",
          "num_valid_ptr": "*i32", "order_ptr": "*i32", "sinks_ptr": "*fp32"}  # fmt: skip
_OPS = ("LDS.U8", "LDSM", "LDS", "LDGSTS", "LDG", "F2FP", "HMMA", "HGMMA", "PRMT", "SHFL")
_INSTR = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*)", re.M)


def loop_body(sass: str) -> list[str]:
    """The opcodes of the largest backward-branch loop (the main loop over KV tiles)."""
    instrs = [(int(a, 16), op, rest) for a, op, rest in _INSTR.findall(sass)]
    best: tuple[int, int, int] | None = None
    for addr, op, rest in instrs:
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < addr:
            lo = int(target.group(1), 16)
            size = sum(1 for a, _, _ in instrs if lo <= a <= addr)
            if best is None or size > best[0]:
                best = (size, lo, addr)
    if best is None:
        return []
    return [op for a, op, _ in instrs if best[1] <= a <= best[2]]


def compile_candidate(config: DecodeConfig, sass_dir: str | None) -> dict[str, object]:
    consts = kernel_constexprs(
        num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16, num_splits=1,
        has_limit=False, block_n=config.block_n, convert=config.fp8_convert,
    )  # fmt: skip
    build = compile_sm90(
        decode_split_fp8_kernel, consts, _TYPES, config.num_warps, config.num_stages, sass=True
    )
    sass = build.sass
    if sass_dir:
        name = (
            f"fp8_bn{config.block_n}_w{config.num_warps}_st{config.num_stages}_"
            f"{config.fp8_convert.value}"
        )
        with open(os.path.join(sass_dir, name + ".sass"), "w") as out:
            out.write(sass)
    return {
        "regs": build.regs,
        "stack": build.stack,
        "smem": build.smem,
        "per SM": min(build.programs_per_sm(config.num_warps), 32),
        **loop_figures(sass, config.num_warps, config.block_n),
    }


def loop_figures(sass: str, num_warps: int, block_n: int) -> dict[str, object]:
    """The main loop's _OPS counts, its length, and its warp instructions per KV byte (each
    warp runs the loop once per tile of block_n K and V rows of 128 fp8 bytes)."""
    ops = loop_body(sass)
    counts = {op: 0 for op in _OPS}
    for op in ops:
        for name in _OPS:
            if op == name or op.startswith(name + "."):
                counts[name] += 1
                break
    per_byte = round(len(ops) * num_warps / (2 * block_n * 128), 3)
    return {**counts, "loop": len(ops), "per byte": per_byte}


def bf16_reference() -> str:
    """The bf16-cache kernel at its default launch (99% of copy on the H200): its loop's warp
    instructions per KV byte, the calibration for the fp8 figures."""
    cfg = decode_attention.DEFAULT_CONFIG
    consts: dict[str, object] = {
        "NUM_Q_HEADS": 32, "NUM_KV_HEADS": 8, "GROUP": 4, "HEAD_DIM": 128, "BLOCK_SIZE": 16,
        "SPLIT": False, "PAGED": False, "FUSED": False, "HAS_LIMIT": False, "HAS_ORDER": False,
        "BLOCK_G": 16, "BLOCK_N": cfg.block_n, "BLOCK_D": 128, "BLOCK_S": 1, "PRECISION": "tf32",
        "SOFTCAP": False, "SINKS": False,
    }  # fmt: skip
    types = {**_TYPES, "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "counter_ptr": "*i32"}
    build = compile_sm90(decode_attention._decode_split_kernel, consts, types, cfg.num_warps,
                         cfg.num_stages, sass=True)  # fmt: skip
    loop = len(loop_body(build.sass))
    per_byte = loop * cfg.num_warps / (2 * cfg.block_n * 256)
    return (f"bf16-kv (reference) bn={cfg.block_n} w={cfg.num_warps} st={cfg.num_stages}  "
            f"loop {loop} per byte {per_byte:.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sass", help="write each candidate's SASS into this folder")
    args = parser.parse_args()
    if args.sass:
        os.makedirs(args.sass, exist_ok=True)
    print(bf16_reference(), flush=True)
    for kind, config in dict.fromkeys(CANDIDATES):
        if kind != "fp8":
            continue
        head = (
            f"fp8-kv bn={config.block_n:<3} w={config.num_warps} st={config.num_stages} "
            f"{config.fp8_convert.value}"
        )
        try:
            info = compile_candidate(config, args.sass)
        except Exception as exc:  # report and go on
            print(f"{head}  FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        print(f"{head}  " + " ".join(f"{k} {v}" for k, v in info.items()), flush=True)


if __name__ == "__main__":
    main()
