"""The int4 skinny kernel (kernels/quant_gemv.int4_skinny: 2-16 rows of x in one program, W
read once) x tile configs, against bf16 and the per-row GEMV path it replaced, on the
Llama-3.1-8B step of ops/quant_bench.py (every linear of 32 layers + lm_head, one CUDA graph
replayed per timing):

    python -m troupe.ops.int4_skinny_sweep                  # rows 2 4 8 16, on a CUDA device
    python -m troupe.ops.int4_skinny_sweep --rows 4

One line per (rows, config): ms per step, times bf16's speed, weight bytes per step against
the copy bandwidth measured here; "gemv" is the path before the skinny kernel (the decode GEMV
once per row of x: INT4_SKINNY_MIN_ROWS raised past the rows). Ends with the error of the
default at 4 rows against the dequantized reference (gate_up). The default is
int4_skinny's signature (block_n 64, block_k 128, 4 warps: the best of this sweep on the H200,
docs/benchmarks.md session 13).
"""

from __future__ import annotations

import argparse
import functools

import torch
import troupe.kernels.quant_gemv as qg
from troupe.ops.quant_bench import GROUP, HIDDEN, INTER, LAYERS, copy_bandwidth, timed, weights

# (block_n, block_k, warps)
CONFIGS = [
    (64, 128, 4),  # the default
    (32, 256, 4),
    (64, 256, 4),
    (16, 256, 4),
    (32, 128, 4),
    (32, 512, 4),
    (32, 256, 8),
    (64, 256, 8),
    (128, 128, 8),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[2, 4, 8, 16])
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    bw = copy_bandwidth(device)
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    dense, int4, _ = weights(LAYERS, device)
    nbytes = sum(p.numel() + s.numel() * 2 + b.numel() * 2 for p, s, b in int4)
    skinny, min_rows = qg.int4_skinny, qg.INT4_SKINNY_MIN_ROWS
    try:
        for rows in args.rows:
            xs = {
                k: torch.randn(rows, k, device=device, dtype=torch.bfloat16)
                for k in (HIDDEN, INTER)
            }

            def step_bf16(xs: dict[int, torch.Tensor] = xs) -> None:
                for w in dense:
                    torch.nn.functional.linear(xs[w.shape[1]], w)

            def step_int4(xs: dict[int, torch.Tensor] = xs) -> None:
                for p, s, b in int4:
                    qg.int4_matmul(xs[p.shape[1] * 2], p, s, b, GROUP)

            t16 = timed(step_bf16, device)
            print(f"rows {rows:2d}: bf16            {t16 * 1e3:7.3f} ms", flush=True)
            qg.INT4_SKINNY_MIN_ROWS = rows + 1  # the per-row GEMV path
            _line(rows, "gemv", timed(step_int4, device), t16, nbytes, bw)
            qg.INT4_SKINNY_MIN_ROWS = min_rows
            for block_n, block_k, warps in CONFIGS:
                qg.int4_skinny = functools.partial(
                    skinny, block_n=block_n, block_k=block_k, num_warps=warps
                )
                name = f"n{block_n}/k{block_k}/w{warps}"
                try:
                    _line(rows, name, timed(step_int4, device), t16, nbytes, bw)
                except Exception as exc:  # out of resources, a compile error: skip the config
                    print(f"rows {rows:2d}: {name:15s} failed: {type(exc).__name__}: {exc}"[:200])
                qg.int4_skinny = skinny
    finally:
        qg.int4_skinny, qg.INT4_SKINNY_MIN_ROWS = skinny, min_rows
    x = torch.randn(4, HIDDEN, device=device, dtype=torch.bfloat16)
    p, s, b = int4[2]
    want = qg.int4_reference(x.float(), p, s, b, GROUP)
    err = (qg.int4_matmul(x, p, s, b, GROUP).float() - want).abs().max() / want.abs().max()
    print(f"gate_up, 4 rows, the default: max error / max |y| {err:.2e}")


def _line(rows: int, name: str, seconds: float, t16: float, nbytes: int, bw: float) -> None:
    print(
        f"rows {rows:2d}: {name:15s} {seconds * 1e3:7.3f} ms  {t16 / seconds:.2f}x bf16  "
        f"{nbytes / seconds / bw:.0%} of copy",
        flush=True,
    )


if __name__ == "__main__":
    main()
