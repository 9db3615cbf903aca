"""Where the int4 batch-1 chain loses against its launches timed alone (GPU; issue 16).

    python3 -m troupe.ops.int4_chain_probe

quant_bench's int4 step (Llama-3.1-8B: 32 x [qkv, o, gate_up, down] + lm_head, one row, the
engine's GEMV launches, PDL) took longer than its launches timed 32 of a shape in a row add up
to. This times the same work in other orders and compiled forms, each captured in a CUDA graph
(quant_bench.timed):

    chain              the step as quant_bench runs it (the engine's launches: qkv and o
                       take 32 columns over the whole of K, gate_up and down 128 columns, down
                       split along K; gate_up's launch of the split kernel stores at one split
                       (quant_int4.split_compiled): two compiled kernels, two switches a layer)
    three kernels      the chain with gate_up compiled SPLIT off (the engine to session 42)
    grouped            the chain's launches, 32 of each shape in a row, then lm_head
    pdl off            the chain without programmatic dependent launch
    one kernel         every launch 128 columns and 32 groups an iteration, K split: one
                       compiled kernel for the whole step
    one narrow kernel  every launch 32 columns and 128 groups an iteration (the whole-K
                       launches' tile), K split where gemv_grid splits it, SPLIT on
    bf16               the step with bf16 weights through torch (quant_bench's baseline)

and each shape's 32 launches alone. Prints ms per step and the speed-up over bf16.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from troupe.kernels.arrival import arrival_counters, gemv_grid
from troupe.kernels.gemv_pdl import pdl_mode
from troupe.kernels.quant_int4 import (
    INT4_COLS_GEMV,
    WHOLE_K_COLUMNS,
    GemvLaunch,
    Int4Cols,
    gemv_launch,
    split_compiled,
)
from troupe.ops.int4_gemv_anatomy import launch_row, random_int4
from troupe.ops.quant_bench import HIDDEN, INTER, LAYERS, SHAPES, VOCAB, timed

NAMES = ("qkv", "o", "gate_up", "down")


class Launch(NamedTuple):
    w: Int4Cols
    out: torch.Tensor
    part: torch.Tensor
    counters: torch.Tensor
    grid: GemvLaunch
    split_kernel: bool  # SPLIT compiled on (at one split it stores)


def launch_of(w: Int4Cols, form: str) -> Launch:
    """The engine's launch ("engine"), with SPLIT compiled off where it does not split
    ("three"), or 128 columns and 32 groups an iteration split along K as gemv_grid sizes it
    ("one"), or 32 columns and 128 groups so ("narrow": the whole-K launches' kernel, SPLIT
    on)."""
    n, k = w.shape
    device = w.words.device
    if form in ("one", "narrow"):
        c = INT4_COLS_GEMV
        block_n, groups = (c.block_n, c.groups) if form == "one" else (WHOLE_K_COLUMNS, 128)
        grid = GemvLaunch(block_n, groups,
                          *gemv_grid(1, n, -(-k // 32 // groups), groups, block_n, c.waves,
                                     device)[1:])  # fmt: skip
    else:
        grid = gemv_launch(1, n, k // 32, INT4_COLS_GEMV, device)
    split_kernel = grid.split > 1 if form == "three" else split_compiled(grid) or form == "narrow"
    out = torch.empty(1, n, dtype=torch.bfloat16, device=device)
    part = torch.empty(grid.split, 1, n, dtype=torch.float32, device=device)
    counters = arrival_counters(grid.col_blocks, device)
    return Launch(w, out, part, counters, grid, split_kernel)


def run(
    launches: list[Launch], xs: dict[int, torch.Tensor], pdl: bool = True
) -> Callable[[], None]:
    mode = pdl_mode(pdl, next(iter(xs.values())).device)

    def step() -> None:
        for w, out, part, counters, c, split_kernel in launches:
            launch_row(xs[w.shape[1]], w, out, part, counters, c, mode, split_kernel=split_kernel)

    return step


def main() -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(device))
    layers = [[random_int4(n, k) for n, k in SHAPES] for _ in range(LAYERS)]
    head = random_int4(VOCAB, HIDDEN)
    xs = {k: torch.randn(1, k, device=device, dtype=torch.bfloat16) for k in (HIDDEN, INTER)}

    def step_of(form: str, grouped: bool = False) -> list[Launch]:
        order = [(i, j) for j in range(len(SHAPES)) for i in range(LAYERS)] if grouped else [
            (i, j) for i in range(LAYERS) for j in range(len(SHAPES))]  # fmt: skip
        ws = [layers[i][j] for i, j in order] + [head]
        return [launch_of(w, form) for w in ws]

    chain = step_of("engine")
    ref = {id(la.w): la for la in chain}
    run(chain, xs)()
    for name, launches in (("one kernel", step_of("one")), ("three kernels", step_of("three")),
                           ("one narrow kernel", step_of("narrow"))):  # fmt: skip
        run(launches, xs)()
        worst = max((la.out.float() - ref[id(la.w)].out.float()).abs().max().item()
                    for la in launches)  # fmt: skip
        print(f"{name}: max difference from the engine's launches {worst:.2e}")
    for j, name in enumerate(NAMES):
        t = timed(run([launch_of(layer[j], "engine") for layer in layers], xs), device) * 1e3
        print(f"{name} x{LAYERS} alone: {t:.3f} ms ({t / LAYERS * 1e3:.2f} us each)")
    dense = [torch.randn(n, k, device=device, dtype=torch.bfloat16) for n, k in SHAPES * LAYERS]
    dense.append(torch.randn(VOCAB, HIDDEN, device=device, dtype=torch.bfloat16))

    def bf16() -> None:
        for w in dense:
            torch.nn.functional.linear(xs[w.shape[1]], w)

    base = timed(bf16, device) * 1e3
    print(f"bf16: {base:.3f} ms")
    rows = {
        "chain": run(chain, xs),
        "three kernels": run(step_of("three"), xs),
        "grouped": run(step_of("engine", grouped=True), xs),
        "pdl off": run(chain, xs, pdl=False),
        "one kernel": run(step_of("one"), xs),
        "one narrow kernel": run(step_of("narrow"), xs),
    }
    for name, step in rows.items():
        t = timed(step, device) * 1e3
        print(f"{name}: {t:.3f} ms, {base / t:.2f}x bf16")


if __name__ == "__main__":
    main()
