"""MoE kernel benchmark (GPU): the fused Triton MoE at decode and prefill sizes.

    python -m troupe.ops.moe_bench [--sweep]

DeepSeek-V2-Lite expert shapes, random bf16 weights: 64 routed experts, top-6, hidden 2048,
moe_intermediate 1408; routing from random router logits (softmax top-k, renormalised).
Decode: 256 tokens; the rate is bytes/s over the active experts' weights (w13 and w2 of every
expert some token picked, read once) plus x and out, against copy bandwidth (read + write of
1 GiB). Prefill: 16,384 tokens; the rate is TFLOP/s (6 * H * I per (token, expert) pair)
against a bf16 torch.matmul of 8192^3. Times are medians of triton.testing.do_bench.
"""

from __future__ import annotations

import argparse
import itertools

import torch
from troupe.kernels.fused_moe import block_m_for, fused_moe_triton
from troupe.kernels.moe_reference import fused_moe, route_topk
from troupe.ops.kernel_bench import copy_bandwidth, median_ms

NUM_EXPERTS, TOP_K, HIDDEN, INTER = 64, 6, 2048, 1408
DTYPE = torch.bfloat16


def matmul_peak() -> float:
    a = torch.randn(8192, 8192, dtype=DTYPE, device="cuda")
    b = torch.randn(8192, 8192, dtype=DTYPE, device="cuda")
    ms = median_ms(lambda: a @ b)
    return 2 * 8192**3 / (ms * 1e-3)


def problem(tokens: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(DTYPE)

    x = randn(tokens, HIDDEN, scale=1.0)
    w13 = randn(NUM_EXPERTS, 2 * INTER, HIDDEN, scale=HIDDEN**-0.5)
    w2 = randn(NUM_EXPERTS, HIDDEN, INTER, scale=INTER**-0.5)
    logits = randn(tokens, NUM_EXPERTS, scale=1.0)
    weights, ids = route_topk(logits, TOP_K, renormalize=True)
    return x, w13, w2, weights, ids


def rel_error(got: torch.Tensor, args: tuple[torch.Tensor, ...], rows: int = 64) -> float:
    x, w13, w2, weights, ids = args
    ref = fused_moe(x[:rows].float(), w13.float(), w2.float(), weights[:rows].float(), ids[:rows])
    return float((got[:rows].float() - ref).norm() / ref.norm())


def run(tokens: int, sweep: bool, copy_bw: float, peak: float) -> None:
    args = problem(tokens, seed=tokens)
    x, w13, w2, _weights, ids = args
    active = int(torch.unique(ids).numel())
    weight_bytes = active * (w13[0].numel() + w2[0].numel()) * w13.element_size()
    io_bytes = 2 * x.numel() * x.element_size()
    flops = 6 * HIDDEN * INTER * tokens * TOP_K
    default_bm = block_m_for(tokens * TOP_K, NUM_EXPERTS)
    configs = [(default_bm, 64, 64)]
    if sweep:
        configs += [
            c for c in itertools.product((16, 32, 64, 128), (32, 64, 128), (32, 64, 128))
            if c != configs[0]
        ]  # fmt: skip
    for bm, bn, bk in configs:

        def call(bm: int = bm, bn: int = bn, bk: int = bk) -> torch.Tensor:
            return fused_moe_triton(*args, block_m=bm, block_n=bn, block_k=bk)

        try:
            err = rel_error(call(), args)
            ms = median_ms(call)
        except Exception as exc:  # a sweep tile the GPU cannot hold
            print(f"  T={tokens} bm={bm} bn={bn} bk={bk}: failed ({type(exc).__name__})")
            continue
        bw = (weight_bytes + io_bytes) / (ms * 1e-3)
        tflops = flops / (ms * 1e-3)
        print(
            f"T={tokens:>6} bm={bm:>3} bn={bn:>3} bk={bk:>3}  {ms * 1e3:>9.1f} us  "
            f"active experts {active:>2}  {bw / 1e12:5.2f} TB/s ({bw / copy_bw:4.0%} of copy)  "
            f"{tflops / 1e12:6.1f} TFLOP/s ({tflops / peak:4.0%} of matmul)  rel err {err:.1e}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="try tile sizes")
    args = parser.parse_args()
    copy_bw = copy_bandwidth()
    peak = matmul_peak()
    print(
        f"{torch.cuda.get_device_name()}: copy {copy_bw / 1e12:.2f} TB/s, "
        f"bf16 matmul {peak / 1e12:.0f} TFLOP/s"
    )
    for tokens in (256, 16384):
        run(tokens, args.sweep, copy_bw, peak)


if __name__ == "__main__":
    main()
