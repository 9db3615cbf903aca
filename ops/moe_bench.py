"""MoE kernel benchmark (GPU): the fused Triton MoE at decode and prefill sizes, four shapes.

    python -m troupe.ops.moe_bench                     # the engine's defaults (moe_config)
    python -m troupe.ops.moe_bench --sweep-variants    # every variant x a few configs, BEST

Expert layers, random bf16 weights, routing from random router logits (softmax top-k):
    deepseek-v2-lite  64 routed experts top-6, hidden 2048, moe_intermediate 1408 (its 2
                      shared experts are a dense MLP outside the fused kernel: not counted)
    qwen3-30b-a3b     128 experts top-8, hidden 2048, moe_intermediate 768
    gpt-oss-20b       32 experts top-4, hidden 2880, intermediate 2880, with GPT-OSS's expert
                      biases and clamped SwiGLU (kernels/clamped_swiglu.py; the biases' bytes
                      counted too)
    gpt-oss-20b-mxfp4 the same with the experts kept as MXFP4 (kernels/fused_moe_mxfp4.py;
                      4.25 bits a weight counted)
Decode: 256 tokens; the rate is bytes/s over the weights of the experts some token picked
(w13 and w2 of each, read once) plus x and out, against copy bandwidth (read + write of 1 GiB).
Prefill: 16,384 tokens; the rate is TFLOP/s (6 * H * I per (token, expert) pair) against a
bf16 torch.matmul of 8192^3. Every config is checked against the fp32 torch reference on the
first 64 tokens (relative error; WRONG above 2e-2). Times are medians of do_bench.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import torch
import triton.testing
from troupe.kernels.clamped_swiglu import ClampedSwiglu
from troupe.kernels.fused_moe import fused_moe_triton
from troupe.kernels.moe_align import moe_align
from troupe.kernels.moe_align_triton import moe_align_triton
from troupe.kernels.moe_config import (
    MoeKernelConfig,
    MoeVariant,
    block_m_for,
    config_for,
    config_source,
)
from troupe.kernels.moe_reference import fused_moe, route_topk
from troupe.kernels.mxfp4 import Mxfp4Experts
from troupe.ops.bench_timing import median_ms
from troupe.ops.card_rates import copy_bandwidth, matmul_peak

DTYPE = torch.bfloat16
CHECK_ROWS, MAX_REL_ERROR = 64, 2e-2
DECODE_TOKENS, PREFILL_TOKENS = 256, 16384


@dataclass(frozen=True)
class Shape:
    num_experts: int
    top_k: int
    hidden: int
    inter: int
    gpt_oss: bool = False  # biased experts, clamped SwiGLU
    mxfp4: bool = False  # the experts packed (kernels/mxfp4.py)


SHAPES = {
    "deepseek-v2-lite": Shape(num_experts=64, top_k=6, hidden=2048, inter=1408),
    "qwen3-30b-a3b": Shape(num_experts=128, top_k=8, hidden=2048, inter=768),
    "gpt-oss-20b": Shape(num_experts=32, top_k=4, hidden=2880, inter=2880, gpt_oss=True),
    "gpt-oss-20b-mxfp4": Shape(
        num_experts=32, top_k=4, hidden=2880, inter=2880, gpt_oss=True, mxfp4=True
    ),
}

F, S = MoeVariant.FUSED, MoeVariant.SPLIT_K
DECODE_SWEEP = [
    MoeKernelConfig(F, 32, 64, 128, num_warps=4, num_stages=4),
    MoeKernelConfig(F, 16, 64, 256, num_warps=4, num_stages=3),
    MoeKernelConfig(F, 32, 64, 128, num_warps=4, num_stages=4, swap_ab=True),
    MoeKernelConfig(F, 32, 64, 128, num_warps=4, num_stages=4, swap_ab=True, triton_align=True),
    MoeKernelConfig(F, 16, 64, 256, num_warps=4, num_stages=3, swap_ab=True),
    MoeKernelConfig(F, 64, 64, 128, num_warps=4, num_stages=4, swap_ab=True, triton_align=True),
    MoeKernelConfig(F, 32, 128, 128, num_warps=8, num_stages=3, swap_ab=True, atomic_reduce=True),
    MoeKernelConfig(S, 32, 64, 128, num_warps=4, num_stages=3, split_k=2),
    MoeKernelConfig(S, 16, 64, 128, num_warps=4, num_stages=4, split_k=4, triton_align=True),
    MoeKernelConfig(S, 32, 64, 128, num_warps=4, num_stages=4, split_k=4, swap_ab=True),
]
PREFILL_SWEEP = [
    MoeKernelConfig(F, 128, 128, 64, num_warps=8, num_stages=3),
    MoeKernelConfig(F, 128, 128, 64, num_warps=8, num_stages=3, group_m=1),
    MoeKernelConfig(F, 128, 128, 64, num_warps=8, num_stages=3, group_m=8),
    MoeKernelConfig(F, 128, 128, 64, num_warps=8, num_stages=4, group_m=8),
    MoeKernelConfig(F, 128, 64, 64, num_warps=4, num_stages=4, group_m=8),
    MoeKernelConfig(F, 128, 128, 64, num_warps=8, num_stages=3, group_m=8, atomic_reduce=True),
    MoeKernelConfig(S, 128, 128, 64, num_warps=8, num_stages=3, group_m=8, split_k=1),
]


@dataclass
class Workload:
    name: str
    tokens: int
    args: tuple[Any, ...]  # x, w13, w2 (tensors or Mxfp4Experts), topk_weights, topk_ids
    extras: dict[str, Any]  # GPT-OSS's b13, b2 and clamped (fused_moe's keywords); {}: none
    ref: torch.Tensor  # fp32 reference of the first CHECK_ROWS tokens
    active: int  # experts some token picked
    num_bytes: int  # their weights + x + out
    flops: int


def workloads(
    name: str, shape: Shape, token_counts: list[int], device: str = "cuda"
) -> list[Workload]:
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*dims: int, scale: float) -> torch.Tensor:
        return (torch.randn(*dims, generator=gen, device=device) * scale).to(DTYPE)

    e, h, inter = shape.num_experts, shape.hidden, shape.inter
    w13: torch.Tensor | Mxfp4Experts = randn(e, 2 * inter, h, scale=h**-0.5)
    w2: torch.Tensor | Mxfp4Experts = randn(e, h, inter, scale=inter**-0.5)
    w13_f = w13.float() if isinstance(w13, torch.Tensor) else w13
    w2_f = w2.float() if isinstance(w2, torch.Tensor) else w2
    if shape.mxfp4:  # exponents around 2^-6: values like the dense ones'
        w13, w2 = packed(e, 2 * inter, h, gen, device), packed(e, h, inter, gen, device)
        w13_f, w2_f = w13, w2
    extras: dict[str, Any] = {}
    if shape.gpt_oss:
        extras = {"b13": randn(e, 2 * inter, scale=0.1), "b2": randn(e, h, scale=0.1)}
        extras["clamped"] = ClampedSwiglu()
    extras_f: dict[str, Any] = {
        k: v.float() if isinstance(v, torch.Tensor) else v for k, v in extras.items()
    }
    out = []
    for tokens in token_counts:
        x = randn(tokens, h, scale=1.0)
        weights, ids = route_topk(randn(tokens, e, scale=1.0), shape.top_k, renormalize=True)
        r = CHECK_ROWS
        ref = fused_moe(x[:r].float(), w13_f, w2_f, weights[:r].float(), ids[:r], **extras_f)
        active = int(torch.unique(ids).numel())
        weight_bytes = 3 * h * inter * (17 / 32 if shape.mxfp4 else DTYPE.itemsize)
        bias_bytes = (2 * inter + h) * DTYPE.itemsize if shape.gpt_oss else 0
        num_bytes = int(active * (weight_bytes + bias_bytes)) + 2 * x.numel() * x.element_size()
        flops = 6 * h * inter * tokens * shape.top_k
        out.append(
            Workload(
                name, tokens, (x, w13, w2, weights, ids), extras, ref, active, num_bytes, flops
            )
        )
    return out


def packed(e: int, n: int, k: int, gen: torch.Generator, device: str) -> Mxfp4Experts:
    """Random MXFP4 experts [E, N, K]: random codes, exponents 2^-7 to 2^-5."""
    blocks = torch.randint(0, 256, (e, n, k // 2), generator=gen, device=device, dtype=torch.uint8)
    scales = torch.randint(120, 123, (e, n, k // 32), generator=gen, device=device)
    return Mxfp4Experts(blocks, scales.to(torch.uint8))


def measure(work: Workload, config: MoeKernelConfig | None, rep_ms: int) -> tuple[float, float]:
    """(median us, relative error on the first CHECK_ROWS tokens) of one config."""

    def call() -> torch.Tensor:
        return fused_moe_triton(*work.args, config=config, **work.extras)

    got = call()[:CHECK_ROWS].float()
    err = float((got - work.ref).norm() / work.ref.norm())
    ms = float(triton.testing.do_bench(call, warmup=10, rep=rep_ms, return_mode="median"))
    return ms * 1e3, err


def row(work: Workload, label: str, us: float, err: float, copy_bw: float, peak: float) -> str:
    bw, fl = work.num_bytes / (us * 1e-6), work.flops / (us * 1e-6)
    flag = "" if err <= MAX_REL_ERROR else "  WRONG"
    return (
        f"{work.name:<17} T={work.tokens:>6} {label:<42} {us:>9.1f} us  "
        f"{bw / 1e12:5.2f} TB/s {bw / copy_bw:4.0%} copy  "
        f"{fl / 1e12:6.1f} TFLOP/s {fl / peak:4.0%} mm  err {err:.1e}{flag}"
    )


def sweep(work: Workload, copy_bw: float, peak: float, variants: bool) -> None:
    decode = work.tokens <= DECODE_TOKENS
    configs: list[MoeKernelConfig | None] = [None]
    if variants:
        configs += DECODE_SWEEP if decode else PREFILL_SWEEP
    best: tuple[float, str, str, MoeKernelConfig] | None = None
    if variants:  # the expert sort alone, at the default block_m
        ids, num_experts = work.args[4], work.args[1].shape[0]
        bm = block_m_for(ids.numel(), num_experts)
        times = [
            median_ms(lambda align=align: align(ids, num_experts, bm)) * 1e3
            for align in (moe_align, moe_align_triton)
        ]
        print(f"{work.name:<17} T={work.tokens:>6} moe_align bm={bm}: torch {times[0]:.1f} us, "
              f"triton {times[1]:.1f} us")  # fmt: skip
    for config in configs:
        if config is None:
            w13, ids = work.args[1], work.args[4]
            used = config_for(ids.numel(), w13.shape[0])
            label = f"{used.variant.value} {used.label()} (default)"
        else:
            label = f"{config.variant.value} {config.label()}"
        try:
            us, err = measure(work, config, rep_ms=100 if variants else 300)
        except Exception as exc:  # out of shared memory, a compile error: next config
            why = f"{type(exc).__name__} {(str(exc).splitlines() or [''])[0][:120]}"
            print(f"{work.name:<17} T={work.tokens:>6} {label:<42} failed: {why}", flush=True)
            continue
        print(row(work, label, us, err, copy_bw, peak), flush=True)
        if err > MAX_REL_ERROR:
            continue
        rate = work.num_bytes / (us * 1e-6) / copy_bw if decode else work.flops / (us * 1e-6)
        figure = f"{rate:.0%} of copy" if decode else f"{rate / 1e12:.0f} TFLOP/s"
        if best is None or us < best[0]:
            used = config or config_for(work.args[4].numel(), work.args[1].shape[0])
            best = (us, label, f"{figure} ({us:.1f} us, {work.name} T={work.tokens})", used)
    if variants and best is not None:
        variant, _, cfg = best[1].partition(" ")
        print(f"BEST {variant} {cfg} {best[2]}", flush=True)
        name = "DECODE_CONFIG" if decode else "PREFILL_CONFIG"
        print(f"  kernels/moe_config.py: {name} = {config_source(best[3])}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep-variants", action="store_true", help="every variant, BEST")
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append", help="default: all")
    parser.add_argument("--tokens", type=int, action="append", help="default: 256 and 16384")
    args = parser.parse_args()
    copy_bw, peak = copy_bandwidth(), matmul_peak()
    print(
        f"{torch.cuda.get_device_name()}: copy {copy_bw / 1e12:.2f} TB/s, "
        f"bf16 matmul {peak / 1e12:.0f} TFLOP/s"
    )
    for name in args.shape or list(SHAPES):
        for work in workloads(name, SHAPES[name], args.tokens or [DECODE_TOKENS, PREFILL_TOKENS]):
            sweep(work, copy_bw, peak, args.sweep_variants)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
