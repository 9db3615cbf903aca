"""Where an int4 batch-1 GEMV's time goes (GPU, issue 16): variants of the column-layout decode
GEMV (kernels/quant_int4.py) on Llama-3.1-8B's linear shapes.

    python -m troupe.ops.int4_gemv_anatomy
    python -m troupe.ops.int4_gemv_anatomy --x-int8   # the integer form's launches (X8_VARIANTS)

32 launches of one shape (32 weights, Q4_0-style codes with a scale and bias per 32) are
captured in a CUDA graph and replayed (quant_bench.timed); printed: us per launch and the splits,
then per shape the engine's own launch (quant_int4.gemv_launch) against the fastest variant
with a correct result, and what a layer's four GEMVs would save with each shape at its best
(what quant_int4.gemv_launch should then take). Variants:

    default        128 columns a program, 32 groups an iteration, 8 warps, 2 programs an SM,
                   PDL (where K is split, the engine's launch takes bn32-g128 when K is at most
                   128 groups, else halves the columns as bn64: quant_int4.gemv_launch)
    no-sum         the same grid with SPLIT off: each split stores its own partial as the
                   output (a wrong result, timed only: what the last-arriving sum costs)
    no-pdl         the default without programmatic dependent launch
    split1         one K split (no sum), fewer programs
    g16w4          16 groups, 4 warps, 4 programs an SM (and its no-sum)
    g8w4           8 groups, 4 warps, 8 programs an SM
    bn64, bn32     64 / 32 output columns a program (more programs, fewer K splits)
    bn32-split1    32 columns a program and no K split: no partials, no sum
    bn64-*         the engine's half-width launch with 16 groups / 4 warps, 4 warps, 3 waves
    waves1, waves3 1 or 3 programs an SM wanted (fewer or more K splits)
    *-g128, *-g64-split1   no K split and no merge: a program takes a narrow column block
                   over the whole of K in one or two iterations (128 or 64 groups, all its
                   loads in flight at once; sm_90: 194-254 registers, no spills)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

import torch
import triton
from troupe.kernels.arrival import gemv_grid, split_buffers
from troupe.kernels.gemv_pdl import GDC, pdl_mode
from troupe.kernels.quant_int4 import (
    INT4_COLS_GEMV,
    GemvLaunch,
    Int4Cols,
    _int4_cols_gemv_kernel,
    gemv_launch,
)
from troupe.ops.quant_bench import timed

SHAPES = ((4096, 4096), (6144, 4096), (4096, 14336), (28672, 4096))


@dataclass(frozen=True)
class Variant:
    groups: int = 32
    warps: int = 8
    waves: int = 2
    pdl: bool = True
    merge: bool = True  # the last-arriving split sums the partials
    splits: int | None = None  # forced K splits
    block_n: int = 128  # output columns a program
    x_int8: bool = False  # x rounded to int8, dp4a (Int4ColsGemv.x_int8)


VARIANTS = {
    "default": Variant(),
    "no-sum": Variant(merge=False),
    "no-pdl": Variant(pdl=False),
    "split1": Variant(splits=1),
    "g16w4": Variant(groups=16, warps=4, waves=4),
    "g16w4-no-sum": Variant(groups=16, warps=4, waves=4, merge=False),
    "g8w4": Variant(groups=8, warps=4, waves=8),
    "bn64": Variant(block_n=64),
    "bn32": Variant(block_n=32),
    "bn32-g16w4": Variant(block_n=32, groups=16, warps=4, waves=4),
    "bn32-split1": Variant(block_n=32, splits=1),
    "bn32-split1-w4": Variant(block_n=32, splits=1, warps=4),
    "bn64-g16w4": Variant(block_n=64, groups=16, warps=4, waves=4),
    "bn64-w4": Variant(block_n=64, warps=4, waves=4),
    "bn64-waves3": Variant(block_n=64, waves=3),
    "waves1": Variant(waves=1),
    "waves3": Variant(waves=3),
    "bn32-g128": Variant(block_n=32, groups=128, splits=1),
    "bn16-g128-w4": Variant(block_n=16, groups=128, warps=4, splits=1),
    "bn32-g64-split1": Variant(block_n=32, groups=64, splits=1),
    "bn64-g64-split1": Variant(block_n=64, groups=64, splits=1),
}


# --x-int8: the integer form (kernels/int4_dp4a.py) at the launches its registers suggest
X8_VARIANTS = {
    "f16-default": Variant(),
    "x8-default": Variant(x_int8=True),
    "x8-g16": Variant(groups=16, x_int8=True),
    "x8-g16-waves3": Variant(groups=16, waves=3, x_int8=True),
    "x8-g16w4": Variant(groups=16, warps=4, waves=4, x_int8=True),
    "x8-g8": Variant(groups=8, waves=4, x_int8=True),
    "x8-bn64": Variant(block_n=64, x_int8=True),
    "x8-bn64-w4": Variant(block_n=64, warps=4, waves=4, x_int8=True),
    "x8-bn32-g128": Variant(block_n=32, groups=128, splits=1, x_int8=True),
    "x8-bn32-g64-split1": Variant(block_n=32, groups=64, splits=1, x_int8=True),
    "x8-bn32-g64-w4": Variant(block_n=32, groups=64, warps=4, splits=1, x_int8=True),
}


def random_int4(n: int, k: int) -> Int4Cols:
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
    scale = (torch.rand(n, k // 32, device="cuda") * 0.004 + 0.001).half()
    return Int4Cols.from_rows(packed, scale, (-8 * scale.float()).half())


def launch_row(
    x: torch.Tensor, w: Int4Cols, out: torch.Tensor, part: torch.Tensor, counters: torch.Tensor,
    c: GemvLaunch, pdl: int, *, split_kernel: bool, x_int8: bool = False,
    num_warps: int = INT4_COLS_GEMV.num_warps,
) -> None:  # fmt: skip
    """One launch of the column GEMV over one row of x as `c` sizes it, with the compiled
    form's choices open (SPLIT compiled on, the integer form, warps); PLAIN off the GPU."""
    n, k = w.shape
    _int4_cols_gemv_kernel[(c.col_blocks, c.split, 1)](
        x, w.words, w.scale, w.bias, out, part, counters, 1, n, k, c.per_split, c.split,
        c.block_n, c.groups, n % c.block_n == 0, x.device.type != "cuda", pdl, split_kernel, 1,
        x_int8, num_warps=num_warps, launch_pdl=pdl == GDC,
    )  # fmt: skip


def time_variant(
    ws: list[Int4Cols], x: torch.Tensor, v: Variant, engine: bool = False
) -> tuple[float, int]:
    """us per launch over the graph of len(ws) launches, and the splits used; `engine`: the
    launch quant_int4.gemv_launch picks for INT4_COLS_GEMV instead of gemv_grid's."""
    k = x.shape[1]
    pdl = pdl_mode(v.pdl, x.device)
    launches = []
    for w in ws:
        n = w.words.shape[1]
        chunks = triton.cdiv(k // 32, v.groups)
        if engine:
            config = replace(INT4_COLS_GEMV, x_int8=v.x_int8)
            launch = gemv_launch(1, n, k // 32, config, x.device)
        else:
            grid = gemv_grid(1, n, chunks, v.groups, v.block_n, v.waves, x.device)
            launch = GemvLaunch(grid[0], v.groups, *grid[1:])
        if v.splits is not None:
            launch = launch._replace(
                split=v.splits, per_split=triton.cdiv(chunks, v.splits) * v.groups
            )
        out, part, counters = split_buffers(launch.split, 1, n, launch.col_blocks, x)
        launches.append((w, out, part, counters, launch))

    def run() -> None:
        for w, out, part, counters, c in launches:
            launch_row(x, w, out, part, counters, c, pdl, split_kernel=v.merge and c.split > 1,
                       x_int8=v.x_int8, num_warps=v.warps)  # fmt: skip

    return timed(run, x.device) / len(ws) * 1e6, launches[0][4].split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--x-int8", action="store_true", help="X8_VARIANTS instead")
    args = parser.parse_args()
    c = INT4_COLS_GEMV
    engine = Variant(c.groups, c.num_warps, c.waves, c.pdl, block_n=c.block_n, x_int8=c.x_int8)
    variants = X8_VARIANTS if args.x_int8 else VARIANTS
    engine_layer = best_layer = 0.0
    for n, k in SHAPES:
        ws = [random_int4(n, k) for _ in range(32)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        shown, correct = [], {}
        for name, variant in variants.items():
            us, split = time_variant(ws, x, variant)
            shown.append(f"{name} {us:.2f} us ({split} splits)")
            if variant.merge or split == 1:  # no-sum forms with splits are wrong, timed only
                correct[name] = us
        print(f"{n} x {k}: " + "; ".join(shown), flush=True)
        engine_us = time_variant(ws, x, engine, engine=True)[0]
        if args.x_int8:
            x8_us = time_variant(ws, x, replace(engine, x_int8=True), engine=True)[0]
            print(f"  engine's launch in the integer form: {x8_us:.2f} us")
        best = min(correct, key=correct.__getitem__)
        engine_layer, best_layer = engine_layer + engine_us, best_layer + correct[best]
        print(f"  engine's launch {engine_us:.2f} us; fastest correct: {best} {correct[best]:.2f}")
    print(f"a layer's four GEMVs: the engine's launches {engine_layer:.2f} us, each shape at its "
          f"fastest {best_layer:.2f} us: {32 * (engine_layer - best_layer):.1f} us less a step "
          "over 32 layers")  # fmt: skip


if __name__ == "__main__":
    main()
