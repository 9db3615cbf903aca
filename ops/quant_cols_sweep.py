"""Launch shapes of the column-layout decode GEMVs (kernels/quant_int4.py, quant_fp8.py) on
the Llama-3.1-8B batch-1 step: every config on the whole step, then per weight shape (32
weights of one shape in a graph, so none sits in L2), against the bf16 step.

    python -m troupe.ops.quant_cols_sweep                # int4, on a CUDA device
    python -m troupe.ops.quant_cols_sweep --form fp8     # fp8 (per-channel scales)
    python -m troupe.ops.quant_cols_sweep --quick        # the per-shape part only

Configs: output columns per program x groups (int4: of 32; fp8: blocks of 16 codes) per
iteration x warps x programs per SM wanted (K is split to reach it; the last split to arrive
sums) x PDL. Every config's output is checked against the torch reference on the gate_up
shape first.
"""

from __future__ import annotations

import argparse
import itertools

import torch
from troupe.kernels.quant_fp8 import Fp8Cols, Fp8ColsGemv, fp8_cols_matmul, fp8_cols_reference
from troupe.kernels.quant_int4 import Int4Cols, Int4ColsGemv, int4_cols_matmul, int4_cols_reference
from troupe.ops.card_rates import copy_bandwidth
from troupe.ops.quant_bench import HIDDEN, INTER, timed, weights

SHAPES = [(128, 16, 4), (128, 32, 4), (128, 32, 8), (128, 16, 8), (256, 16, 4), (256, 16, 8),
          (128, 16, 2), (128, 8, 4), (256, 8, 4)]  # fmt: skip
Config = Int4ColsGemv | Fp8ColsGemv
Cols = Int4Cols | Fp8Cols


def configs(form: str) -> list[Config]:
    make = Int4ColsGemv if form == "int4" else Fp8ColsGemv
    return [
        make(bn, groups, warps, waves, pdl)
        for (bn, groups, warps), waves, pdl in itertools.product(
            SHAPES, (1, 2, 3, 4, 6, 8), (True, False)
        )
    ]


def matmul(x: torch.Tensor, w: Cols, cfg: Config | None = None) -> torch.Tensor:
    if isinstance(w, Int4Cols):
        assert cfg is None or isinstance(cfg, Int4ColsGemv)
        return int4_cols_matmul(x, w, cfg)
    assert cfg is None or isinstance(cfg, Fp8ColsGemv)
    return fp8_cols_matmul(x, w, cfg)


def reference(x: torch.Tensor, w: Cols) -> torch.Tensor:
    return int4_cols_reference(x, w) if isinstance(w, Int4Cols) else fp8_cols_reference(x, w)


def nbytes(ws: list[Cols]) -> int:
    return sum(w.words.numel() * 4 + w.scale.numel() * 4 for w in ws)


def bf16_step(dense: list[torch.Tensor], xs: dict[int, torch.Tensor], dev: torch.device) -> float:
    def step() -> None:
        for w in dense:
            torch.nn.functional.linear(xs[w.shape[1]], w)

    return timed(step, dev)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="per-shape configs only")
    parser.add_argument("--form", choices=("int4", "fp8"), default="int4")
    args = parser.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    dense, int4, fp8 = weights(32, dev)
    cols: list[Cols] = (
        [Int4Cols.from_rows(*w) for w in int4]
        if args.form == "int4"
        else [Fp8Cols.from_rows(*w) for w in fp8]
    )
    del int4, fp8
    sweep = configs(args.form)
    xs = {k: torch.randn(1, k, device=dev, dtype=torch.bfloat16) for k in (HIDDEN, INTER)}
    t_bf16 = bf16_step(dense, xs, dev)
    del dense
    print(f"bf16 step {t_bf16 * 1e3:.3f} ms")
    want = reference(xs[HIDDEN].float(), cols[2]).float()
    for cfg in sweep:
        got = matmul(xs[HIDDEN], cols[2], cfg).float()
        err = ((got - want).abs().max() / want.abs().max()).item()
        assert err < 1e-2, (cfg, err)

    def run(ws: list[Cols], cfg: Config | None) -> float:
        def step() -> None:
            for w in ws:
                matmul(xs[w.shape[1]], w, cfg)

        return timed(step, dev)

    t = run(cols, None)
    print(f"step, the engine's config: {t * 1e3:.3f} ms, {nbytes(cols) / t / bw:.0%} of copy, "
          f"{t_bf16 / t:.2f}x bf16", flush=True)  # fmt: skip
    if not args.quick:
        for cfg in sweep:
            t = run(cols, cfg)
            print(f"step {cfg}: {t * 1e3:.3f} ms, {nbytes(cols) / t / bw:.0%} of copy, "
                  f"{t_bf16 / t:.2f}x bf16", flush=True)  # fmt: skip
    shapes = [cols[i::4][:32] for i in range(4)] + [[cols[-1]] * 1]
    for ws in shapes:
        ranked = sorted(((run(ws, cfg), cfg) for cfg in sweep), key=lambda r: r[0])
        for t, cfg in ranked[:3]:
            print(f"shape {ws[0].shape}: {t / len(ws) * 1e6:.1f} us, "
                  f"{nbytes(ws) / t / bw:.0%} of copy, {cfg}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
