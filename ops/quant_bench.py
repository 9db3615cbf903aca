"""Batch-1 decode step of the Llama-3.1-8B shape: bf16 weights vs 4-bit (Q4_0-style) vs fp8.

    python -m troupe.ops.quant_bench                 # on a CUDA device
    python -m troupe.ops.quant_bench --rows 1 4 16   # more x rows (decode batch sizes)
    python -m troupe.ops.quant_cols_sweep            # the decode GEMVs' launch configs
    python -m troupe.ops.quant_bench --rows 2 3 --gemm   # also int4 through the GEMM
    python -m troupe.ops.quant_bench --x-int8        # also int4 with x rounded to int8 (dp4a)

Random weights for every linear layer of 32 decoder layers (qkv 6144 x 4096, o 4096 x 4096,
gate_up 28672 x 4096, down 4096 x 14336) and lm_head (128256 x 4096). One "step" runs each
layer's four matmuls on x [rows, K] in sequence (what a decode step reads; attention, norms
and the KV cache are the same in every variant and left out). Each variant is captured in a
CUDA graph and replayed, so launch overhead is not measured. Reported: ms per step, weight
bytes read per step, their rate against the copy bandwidth measured here (and the H200's
4.26 TB/s), the speed-up over bf16, and each form's error against its dequantized reference
on one layer.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from troupe.kernels.quant_fp8 import Fp8Cols, fp8_cols_matmul, fp8_cols_reference
from troupe.kernels.quant_int4 import (
    INT4_COLS_GEMV,
    INT4_ROWS_GEMV,
    Int4Cols,
    int4_cols_matmul,
    int4_cols_reference,
)
from troupe.kernels.quant_int4_gemm import int4_cols_gemm
from troupe.ops.card_rates import copy_bandwidth

HIDDEN, INTER, LAYERS, VOCAB = 4096, 14336, 32, 128256
SHAPES = [(6144, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]
GROUP = 32


def timed(step: Callable[[], None], device: torch.device, iters: int = 50) -> float:
    """Seconds per replay of `step` captured in a CUDA graph."""
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()  # compile and warm up outside the capture
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        graph.replay()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / iters


Int4W = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Fp8W = tuple[torch.Tensor, torch.Tensor]


def weights(
    layers: int, device: torch.device
) -> tuple[list[torch.Tensor], list[Int4W], list[Fp8W]]:
    """Random weights of every linear of the step: bf16, int4 (packed, scale, bias), fp8."""
    shapes = SHAPES * layers + [(VOCAB, HIDDEN)]
    dense = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02 for n, k in shapes]
    int4 = []
    for w in dense:
        n, k = w.shape
        packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device)
        scale = (torch.rand(n, k // GROUP, device=device) * 0.004 + 0.001).half()
        int4.append((packed, scale, (-8 * scale.float()).half()))
    fp8 = []
    for w in dense:
        scale = w.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-8) / 448
        fp8.append(((w.float() / scale).to(torch.float8_e4m3fn), scale))
    return dense, int4, fp8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="*", help="default: 1")
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument(
        "--gemm", action="store_true",
        help="also int4 through the GEMM at the rows the multi-row GEMV takes (2 to "
        "quant_int4.INT4_ROWS_GEMV.max_rows): what the GEMV saves",
    )  # fmt: skip
    parser.add_argument(
        "--x-int8", action="store_true",
        help="also int4 through the GEMV with Int4ColsGemv.x_int8 (x rounded to int8, dp4a)",
    )  # fmt: skip
    args = parser.parse_args()
    x8 = replace(INT4_COLS_GEMV, x_int8=True)
    x8_rows = replace(INT4_ROWS_GEMV, x_int8=True)
    device = torch.device("cuda")
    torch.manual_seed(0)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s (H200 spec 4.26 TB/s)")
    dense, int4, fp8 = weights(args.layers, device)
    bytes_bf16 = sum(w.numel() * 2 for w in dense)
    bytes_int4 = sum(p.numel() + s.numel() * 2 + b.numel() * 2 for p, s, b in int4)
    cols = [Int4Cols.from_rows(*w) for w in int4]  # the GPU's layouts (kernels/quant_int4.py,
    cols8 = [Fp8Cols.from_rows(*w) for w in fp8]  # quant_fp8.py)
    bytes_fp8 = sum(q.numel() + s.numel() * 4 for q, s in fp8)
    for rows in args.rows or [1]:
        xs = {k: torch.randn(rows, k, device=device, dtype=torch.bfloat16) for k in (HIDDEN, INTER)}

        def step_bf16(xs: dict[int, torch.Tensor] = xs) -> None:
            for w in dense:
                torch.nn.functional.linear(xs[w.shape[1]], w)

        def step_int4(xs: dict[int, torch.Tensor] = xs) -> None:
            for w in cols:
                int4_cols_matmul(xs[w.shape[1]], w)

        def step_fp8(xs: dict[int, torch.Tensor] = xs) -> None:
            for w in cols8:
                fp8_cols_matmul(xs[w.shape[1]], w)

        def step_x8(xs: dict[int, torch.Tensor] = xs, rows: int = rows) -> None:
            for w in cols:
                int4_cols_matmul(xs[w.shape[1]], w, x8 if rows == 1 else x8_rows)

        def step_gemm(xs: dict[int, torch.Tensor] = xs) -> None:
            for w in cols:
                int4_cols_gemm(xs[w.shape[1]], w.words, w.scale, w.bias)

        t_bf16 = timed(step_bf16, device)
        print(f"rows {rows}: bf16 {t_bf16 * 1e3:.3f} ms, {bytes_bf16 / t_bf16 / bw:.0%} of copy")
        forms = [("int4", step_int4, bytes_int4), ("fp8", step_fp8, bytes_fp8)]
        if args.gemm and 2 <= rows <= INT4_ROWS_GEMV.max_rows:
            forms.append(("int4 GEMM", step_gemm, bytes_int4))
        if args.x_int8 and rows <= INT4_ROWS_GEMV.max_rows:
            forms.append(("int4 x-int8", step_x8, bytes_int4))
        for name, step, nbytes in forms:
            t = timed(step, device)
            print(
                f"rows {rows}: {name} {t * 1e3:.3f} ms, {t_bf16 / t:.2f}x bf16, weights "
                f"{nbytes / 2**30:.2f} GiB at {nbytes / t / 1e12:.2f} TB/s = {nbytes / t / bw:.0%}"
                " of copy"
            )
    x = torch.randn(1, HIDDEN, device=device, dtype=torch.bfloat16)
    want = int4_cols_reference(x.float(), cols[2])
    err = (int4_cols_matmul(x, cols[2]).float() - want).abs().max() / want.abs().max()
    want8 = fp8_cols_reference(x.float(), cols8[2])
    err8 = (fp8_cols_matmul(x, cols8[2]).float() - want8).abs().max() / want8.abs().max()
    err_x8 = (int4_cols_matmul(x, cols[2], x8).float() - want).abs().max() / want.abs().max()
    print(f"gate_up, 1 row: max error / max |y|: int4 {err:.2e} (x-int8 {err_x8:.2e}), "
          f"fp8 {err8:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
