"""Compile the extend attention kernel for sm_90 without a GPU; print what each form became.

    python3 -m troupe.ops.extend_compile_check

kernels/extend_attention.py's forms as the model launches them on Qwen3-0.6B heads (16 q, 8 kv,
head_dim 128, GQA 2): new keys through TMA descriptors or pointers, 16-bit or fp32 values,
cache blocks of 16 or 32 tokens, at the launch's stages, with a sliding window, an fp8 cache or
Gemma 2's soft-capped scores. Per form: registers per thread, spill
stack, shared memory and programs per SM (an H200 SM has 227 KiB of shared memory: a form over
it would fail at its first launch). No timing: that is kernel_bench's `triton extend` row.
"""

from __future__ import annotations

from troupe.kernels.extend_attention import DEFAULT_EXTEND, _extend_kernel
from troupe.ops.sm90_compile import compile_sm90

GROUP, HEAD_DIM = 2, 128
# (values, TMA, cache block size, stages, windowed, fp8 cache, soft-capped scores): the
# launches extend_attention_triton makes
FORMS = [
    ("bf16", True, 16, DEFAULT_EXTEND.num_stages, False, False, False),
    ("bf16", True, 32, DEFAULT_EXTEND.num_stages, False, False, False),
    ("bf16", False, 16, DEFAULT_EXTEND.num_stages, False, False, False),  # rows TMA can't take
    ("bf16", True, 16, DEFAULT_EXTEND.num_stages, True, False, False),  # sliding-window layers
    ("bf16", True, 16, DEFAULT_EXTEND.num_stages, False, True, False),  # fp8 cache
    ("bf16", True, 16, DEFAULT_EXTEND.num_stages, True, True, False),
    ("bf16", True, 16, DEFAULT_EXTEND.num_stages, True, False, True),  # Gemma 2's local layers
    ("bf16", True, 16, DEFAULT_EXTEND.num_stages, False, False, True),  # and its global ones
    ("fp32", False, 16, 2, False, False, False),  # fp32 models (the GPU tests): 2 stages
]


def main() -> None:
    cfg = DEFAULT_EXTEND
    block_g = GROUP
    print(f"{'values':<6} {'keys':<8} {'block':>5} {'stages':>6} {'window':>6} {'cache':>5} "
          f"{'cap':>3} {'regs':>5} {'spill':>6} {'smem KiB':>8} {'per SM':>6}")  # fmt: skip
    for dtype, tma, block_size, stages, windowed, fp8, capped in FORMS:
        desc = f"tensordesc<{dtype}[{cfg.block_n}, {HEAD_DIM}]>" if tma else f"*{dtype}"
        types = {
            "qk_scale": "fp32",
            "cap": "fp32",
            "k_desc": desc,
            "v_desc": desc,
            **{p: "*i32" for p in ("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr")},
            "decode_prefix_ptr": "*i32",
            **{p: f"*{dtype}" for p in ("q_ptr", "out_ptr")},
            **{p: "*fp8e4nv" if fp8 else f"*{dtype}" for p in ("k_cache_ptr", "v_cache_ptr")},
            **{p: "*fp32" for p in ("k_scale_ptr", "v_scale_ptr", "sinks_ptr")},
            **{p: f"*{dtype}" for p in ("k_new_ptr", "v_new_ptr")},
        }
        consts: dict[str, object] = {
            "HAS_PREFIX": True,
            "TMA": tma,
            "PAGED": cfg.block_n % block_size == 0,
            "WINDOWED": windowed,
            "FP8": fp8,
            "GROUP": GROUP,
            "HEAD_DIM": HEAD_DIM,
            "BLOCK_SIZE": block_size,
            "BLOCK_Q": cfg.block_m // block_g,
            "BLOCK_G": block_g,
            "BLOCK_N": cfg.block_n,
            "BLOCK_D": HEAD_DIM,
            "PRECISION": "ieee" if dtype == "fp32" else "tf32",
            "SOFTCAP": capped,
            "SINKS": False,
        }
        build = compile_sm90(_extend_kernel, consts, types, cfg.num_warps, stages)
        keys = "TMA" if tma else "pointers"
        window, cache = "yes" if windowed else "no", "fp8" if fp8 else dtype
        print(f"{dtype:<6} {keys:<8} {block_size:>5} {stages:>6} {window:>6} {cache:>5} "
              f"{'yes' if capped else 'no':>3} {build.regs:>5} {build.stack:>6} {build.smem / 1024:>8.1f} "
              f"{build.programs_per_sm(cfg.num_warps):>6}")  # fmt: skip


if __name__ == "__main__":
    main()
