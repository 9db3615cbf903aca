"""The extend attention kernel's launch sweep (GPU, issue 9's prefill point): every ExtendConfig
in a grid at 4 x 2,048 new tokens (Qwen3-0.6B heads, bf16, TMA), timed eager and replayed from a
CUDA graph, then the best few on kernel_bench's other prefill shapes.

    python -m troupe.ops.extend_sweep [--quick]

FLOPs count causal pairs as kernel_bench does (4 per (q, k, d)); the paged kernel's default
beside it for scale.
"""

from __future__ import annotations

import argparse
import itertools
import math

import torch
from troupe.kernels.extend_attention import DEFAULT_EXTEND, ExtendConfig, extend_attention_triton
from troupe.kernels.paged_attention import paged_attention_triton
from troupe.kernels.paged_batch import fused_new_kv, make_paged_batch
from troupe.ops.bench_timing import graph_ms, median_ms
from troupe.ops.kernel_bench import BLOCK_SIZE, DTYPE, HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS

SHAPES = {
    "4 x 2048 new": [(0, 2048)] * 4,
    "16 x 512 new": [(0, 512)] * 16,
    "8 x (1536 cached + 512 new)": [(1536, 512)] * 8,
    "1 x 8192 new": [(0, 8192)],
}


def grid(quick: bool) -> list[ExtendConfig]:
    if quick:
        return [DEFAULT_EXTEND, ExtendConfig(128, 64, 8, 2), ExtendConfig(128, 128, 8, 2)]
    return [
        ExtendConfig(bm, bn, w, st)
        for bm, bn, w, st in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4))
        if not (bm == 128 and bn == 128 and st == 4)  # over shared memory at head_dim 128
    ]


def sweep(label: str, configs: list[ExtendConfig]) -> list[tuple[float, ExtendConfig]]:
    lens = SHAPES[label]
    batch = make_paged_batch(
        lens, num_q_heads=NUM_Q_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM,
        block_size=BLOCK_SIZE, dtype=DTYPE, device="cuda", seed=len(lens), poison=False,
    )  # fmt: skip
    scale = 1 / math.sqrt(HEAD_DIM)
    pairs = sum(new * ctx + new * (new + 1) // 2 for ctx, new in lens)
    flops = 4 * pairs * NUM_Q_HEADS * HEAD_DIM
    new_kv = fused_new_kv(batch)
    b = batch

    def paged() -> torch.Tensor:
        return paged_attention_triton(
            b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.query_start_loc, scale,
            b.max_query_len, b.max_seq_len,
        )  # fmt: skip

    ref = paged()
    ms = median_ms(paged)
    print(f"{label} paged default: {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
    found = []
    for cfg in configs:

        def run(cfg: ExtendConfig = cfg) -> torch.Tensor:
            return extend_attention_triton(
                b.q, b.k_cache, b.v_cache, new_kv, b.block_tables, b.seq_lens,
                b.query_start_loc, scale, b.max_seq_len, config=cfg,
            )  # fmt: skip

        try:
            err = float((run().float() - ref.float()).norm() / ref.float().norm())
            eager, graph = median_ms(run), graph_ms(run)
        except Exception as ex:  # a config over shared memory or registers is reported
            print(f"{label} {cfg}: failed {str(ex)[:120]}", flush=True)
            continue
        print(
            f"{label} bm={cfg.block_m} bn={cfg.block_n} w={cfg.num_warps} st={cfg.num_stages}: "
            f"eager {flops / eager / 1e9:.0f}, graph {flops / graph / 1e9:.0f} TFLOP/s, "
            f"rel err vs paged {err:.1e}",
            flush=True,
        )
        found.append((graph, cfg))
    return sorted(found, key=lambda t: t[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three configs, not the grid")
    args = parser.parse_args()
    best = sweep("4 x 2048 new", grid(args.quick))
    top = [cfg for _, cfg in best[:4]]
    if DEFAULT_EXTEND not in top:
        top.append(DEFAULT_EXTEND)
    for label in list(SHAPES)[1:]:
        sweep(label, top)


if __name__ == "__main__":
    main()
