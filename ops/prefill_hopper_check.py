"""Compile the Hopper prefill kernel (kernels/prefill_hopper.py) for sm_90 without a GPU.

    python3 -m troupe.ops.prefill_hopper_check

Qwen3-0.6B heads (16 q, 8 kv, head_dim 128, GQA 2), bf16, for cache pages of 16 tokens (eight
bulk copies a prefix tile) and 256 (one), and with a kv head's two query heads packed in an
item (pack 2) at pages of 16: registers per thread (the launch's cap; setmaxnreg
gives the warpgroups 240 and the producer 24), spill stack, shared memory, and the counts of
wgmma (HGMMA) and TMA loads (UTMALDG) in the SASS. No timing: that is kernel_bench's row.
"""

from __future__ import annotations

import torch
from triton._C.libtriton import native_specialize_impl
from troupe.kernels import prefill_hopper as ph
from troupe.kernels.prefill_hopper_kernel import prefill_hopper_kernel
from troupe.ops.sm90_compile import compile_sm90

BUILDS = ((16, 1), (256, 1), (16, 2))  # (page, pack)


def build(page: int, pack: int) -> str:
    """One line: the build's figures for cache pages of `page` tokens and `pack`."""
    q = torch.empty(64, 16, 128, dtype=torch.bfloat16)
    kv = torch.empty(64, 8, 128, dtype=torch.bfloat16)
    cache = torch.empty(8, page, 8, 128, dtype=torch.bfloat16)
    sub = min(page, ph.BLOCK_N)
    descs = {"q_desc": ph._rows(q, ph.ROWS), "k_desc": ph._rows(kv, ph.BLOCK_N),
             "v_desc": ph._rows(kv, ph.BLOCK_N), "kc_desc": ph._rows(cache, sub),
             "vc_desc": ph._rows(cache, sub)}  # fmt: skip
    types = {n: native_specialize_impl(type(d), d, False, True, True)[0] for n, d in descs.items()}
    types |= {p: "*i32" for p in ("block_tables_ptr", "seq_lens_ptr", "qsl_ptr",
                                  "decode_prefix_ptr", "sched_ptr")}  # fmt: skip
    types |= {"o_ptr": "*bf16", "qk_scale": "fp32"}
    consts: dict[str, object] = {
        "GROUP": 2, "NUM_HEADS": 16, "HEAD_DIM": 128, "PAGE": page,
        "BLOCK_N": ph.BLOCK_N, "STAGES": ph.STAGES, "PINGPONG": True, "PACK": pack,
    }  # fmt: skip
    b = compile_sm90(prefill_hopper_kernel, consts, types, 4, 1, sass=True,
                     maxnreg=ph.MAXNREG)  # fmt: skip
    sass = b.sass.splitlines()
    wgmma = sum("HGMMA" in line for line in sass)
    loads = sum("UTMALDG" in line for line in sass)
    return (f"page {page}, pack {pack}: {b.regs} registers, stack {b.stack}, {b.smem} bytes of shared "
            f"memory, {wgmma} HGMMA, {loads} UTMALDG")  # fmt: skip


def main() -> None:
    for page, pack in BUILDS:
        print(build(page, pack), flush=True)


if __name__ == "__main__":
    main()
