"""Kernel benchmark (GPU): paged decode attention against copy bandwidth, and paged prefill.

    python -m troupe.ops.kernel_bench [--sweep | --sweep-variants]

--sweep-variants: every decode/prefill algorithm variant x launch config (ops/attention_sweep.py).

Decode workload: 256 sequences x 1,024 context, Qwen3-0.6B heads (16 q, 8 kv, head_dim 128),
block_size 16, bf16. Achieved bandwidth counts K and V read once plus q and out, over the median
time. Each decode is timed three ways: `graph`, replayed back to back from a CUDA graph
(triton.testing.do_bench_cudagraph: no launch cost, but the previous call's KV may still be in
L2); `graph, L2 flushed`, replayed with a 256 MiB read before each call (a decode layer in the
engine runs in a graph and finds L2 holding clean lines: the weights and KV that the layers
before it read): the figure to quote; `graph, L2 dirty`, the same with a 256 MiB write instead
(L2 full of dirty lines that the call's reads must first write back: ~50 MB of extra DRAM
traffic, more than a 1 x 32,768 decode's time allows, a state the engine never leaves); and
`eager`, launched from Python each time (triton.testing.do_bench, L2 flushed), which at short
kernels adds the host's launches (two Triton launches and two allocations, ~50 us at
1 x 32,768). torch's SDPA decode on contiguous KV (the approach of
shared/bench/decode_anchor.py) runs on the same shapes, timed the same three ways. Then 256
sequences of differing lengths (the engine's batches), in batch order and longest first
(kernels/decode_order.py).

Prefill: the paged and extend kernels at 4 x 2,048 new tokens and other shapes (a
verification's 5-token chunks over 1,000 cached among them), and on sm_90 the Gluon kernel the
engine takes there (kernels/prefill_hopper.py: with and without pingpong, a kv head's query
heads packed); where every sequence is new and of one length, torch's SDPA on contiguous
tensors too, flash and cuDNN (the fixed-shape ceiling for issue 9's 460 TFLOP/s).
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from troupe.kernels import decode_attention, paged_attention, reference
from troupe.kernels.decode_attention import (
    DecodeConfig,
    choose_num_splits,
    paged_decode_attention_triton,
)
from troupe.kernels.decode_order import longest_first
from troupe.kernels.extend_attention import extend_attention_triton
from troupe.kernels.paged_attention import PrefillConfig, paged_attention_triton
from troupe.kernels.paged_batch import PagedBatch, fused_new_kv, make_paged_batch
from troupe.kernels.prefill_hopper import hopper_prefill_ok, prefill_attention_hopper
from troupe.ops.attention_sweep import sweep_variants
from troupe.ops.bench_timing import flushed_graph_ms, graph_ms, median_ms
from troupe.ops.card_rates import copy_bandwidth

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 16, 8, 128, 16
DTYPE = torch.bfloat16
Row = tuple[str, str, float, str, str]  # workload, kernel, ms, rate, fraction of copy


def decode_bytes(batch: PagedBatch) -> int:
    tokens = int(batch.seq_lens.sum())
    kv = 2 * tokens * NUM_KV_HEADS * HEAD_DIM * batch.k_cache.element_size()
    return int(kv + 2 * batch.q.numel() * batch.q.element_size())


def decode_batch(num_seqs: int, context: int, seed: int) -> PagedBatch:
    return make_paged_batch(
        [(context - 1, 1)] * num_seqs,
        num_q_heads=NUM_Q_HEADS,
        num_kv_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        block_size=BLOCK_SIZE,
        dtype=DTYPE,
        device="cuda",
        seed=seed,
        poison=False,
    )


def check(out: torch.Tensor, batch: PagedBatch, scale: float, rows: int = 16) -> float:
    """Relative error against the fp32 reference on the first rows sequences."""
    ref = reference.paged_decode_attention(  # upcasts the gathered context to fp32
        batch.q[:rows].float(),
        batch.k_cache,
        batch.v_cache,
        batch.block_tables[:rows],
        batch.seq_lens[:rows],
        scale,
        int(batch.seq_lens[:rows].max()),
    )
    return float((out[:rows].float() - ref).norm() / ref.norm())


def run_decode(num_seqs: int, context: int, copy_bw: float, sweep: bool, rows: list[Row]) -> None:
    batch = decode_batch(num_seqs, context, seed=num_seqs + context)
    scale = 1 / math.sqrt(HEAD_DIM)
    nbytes = decode_bytes(batch)
    auto = choose_num_splits(
        num_seqs, NUM_KV_HEADS, context, torch.cuda.get_device_properties(0).multi_processor_count
    )

    def triton_fn(cfg: DecodeConfig, splits: int) -> Callable[[], torch.Tensor]:
        return lambda: paged_decode_attention_triton(
            batch.q,
            batch.k_cache,
            batch.v_cache,
            batch.block_tables,
            batch.seq_lens,
            scale,
            batch.max_seq_len,
            num_splits=splits,
            config=cfg,
        )

    default = decode_attention.DEFAULT_CONFIG  # the engine's (variant and split policy too)
    variants = [(default, auto)]
    if sweep:
        for bn in (32, 64, 128):
            for warps in (4, 8):
                for stages in (2, 3, 4):
                    variants.append(
                        (replace(default, block_n=bn, num_warps=warps, num_stages=stages), auto)
                    )
        for splits in sorted({1, 2, 4, 8, 16, 32, 64, 128} - {auto}):
            variants.append((default, splits))
            variants.append((replace(default, block_n=128, num_warps=4, num_stages=3), splits))
    err = check(triton_fn(default, auto)(), batch, scale)
    workload = f"decode {num_seqs}x{context}"

    def add(name: str, ms: float) -> str:
        bw = nbytes / (ms * 1e-3)
        rows.append((workload, name, ms, f"{bw / 1e12:.2f} TB/s", f"{bw / copy_bw:.0%}"))
        return f"{ms * 1e3:.1f} us ({rows[-1][4]})"

    for cfg, splits in variants:
        name = (
            f"triton {cfg.variant.value} bn={cfg.block_n} w={cfg.num_warps} "
            f"st={cfg.num_stages} sp={splits}"
        )
        try:
            times = {"graph": graph_ms(triton_fn(cfg, splits))}
            times["graph, L2 flushed"] = flushed_graph_ms(triton_fn(cfg, splits))
            times["graph, L2 dirty"] = flushed_graph_ms(triton_fn(cfg, splits), dirty=True)
            times["eager"] = median_ms(triton_fn(cfg, splits))
        except Exception as ex:  # a config that does not fit (shared memory) is reported, not fatal
            print(f"{workload} {cfg} splits={splits}: failed {str(ex)[:100]}")
            continue
        shown = ", ".join(f"{how} {add(f'{name} {how}', ms)}" for how, ms in times.items())
        print(f"{workload} {name}: {shown} of copy, rel err {err:.1e}", flush=True)
    # torch SDPA on contiguous [B, H, T, D] KV, as shared/bench/decode_anchor.py does.
    q4 = batch.q.view(num_seqs, NUM_Q_HEADS, 1, HEAD_DIM)
    k4 = torch.randn(num_seqs, NUM_KV_HEADS, context, HEAD_DIM, dtype=DTYPE, device="cuda")
    v4 = torch.randn_like(k4)
    for label, backend in (
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):

        def sdpa(backend: SDPBackend = backend) -> torch.Tensor:
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True)

        try:
            times = {
                "graph": graph_ms(sdpa),
                "graph, L2 flushed": flushed_graph_ms(sdpa),
                "graph, L2 dirty": flushed_graph_ms(sdpa, dirty=True),
                "eager": median_ms(sdpa),
            }
        except Exception as ex:
            print(f"sdpa[{label}] failed: {str(ex)[:100]}")
            continue
        for how, ms in times.items():
            add(f"torch sdpa[{label}] contiguous {how}", ms)

    torch.cuda.empty_cache()


def run_decode_mixed(copy_bw: float, rows: list[Row], num_seqs: int = 256) -> None:
    """The engine's kind of decode batch: lengths differ (prompt U[100, 1024] plus U[0, 1024]
    generated, seed 0), in batch order and longest first (kernels/decode_order.py)."""
    rng = random.Random(0)
    lens = [rng.randint(100, 1024) + rng.randint(0, 1024) for _ in range(num_seqs)]
    batch = make_paged_batch(
        [(n - 1, 1) for n in lens], num_q_heads=NUM_Q_HEADS, num_kv_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM, block_size=BLOCK_SIZE, dtype=DTYPE, device="cuda", seed=1,
        poison=False,
    )  # fmt: skip
    scale = 1 / math.sqrt(HEAD_DIM)
    order = torch.from_numpy(longest_first(batch.seq_lens.cpu().numpy())).cuda()
    nbytes = decode_bytes(batch)
    workload = f"decode {num_seqs} x U[100, 2048]"
    for name, seq_order in (("batch order", None), ("longest first", order)):

        def call(seq_order: torch.Tensor | None = seq_order) -> torch.Tensor:
            return paged_decode_attention_triton(
                batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                scale, batch.max_seq_len, seq_order=seq_order,
            )  # fmt: skip

        err = check(call(), batch, scale)
        shown = []
        for how, ms in (("graph, L2 flushed", flushed_graph_ms(call)), ("eager", median_ms(call))):
            bw = nbytes / (ms * 1e-3)
            rows.append((workload, f"triton {name} {how}", ms, f"{bw / 1e12:.2f} TB/s",
                         f"{bw / copy_bw:.0%}"))  # fmt: skip
            shown.append(f"{how} {ms * 1e3:.1f} us ({rows[-1][4]})")
        print(f"{workload} {name}: {', '.join(shown)} of copy, rel err {err:.1e}", flush=True)


def run_prefill(
    lens: list[tuple[int, int]], label: str, rows: list[Row], sweep: bool = False
) -> None:
    batch = make_paged_batch(
        lens,
        num_q_heads=NUM_Q_HEADS,
        num_kv_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        block_size=BLOCK_SIZE,
        dtype=DTYPE,
        device="cuda",
        seed=len(lens),
        poison=False,
    )
    scale = 1 / math.sqrt(HEAD_DIM)
    # Causal work: query i of a sequence sees ctx + i + 1 keys; 4 flops per (q, k, d) pair.
    pairs = sum(new * ctx + new * (new + 1) // 2 for ctx, new in lens)
    flops = 4 * pairs * NUM_Q_HEADS * HEAD_DIM
    configs = [paged_attention.DEFAULT_CONFIG]
    if sweep:
        configs += [
            replace(
                paged_attention.DEFAULT_CONFIG,
                block_m=bm,
                block_n=bn,
                num_warps=warps,
                num_stages=stages,
            )
            for bm in (64, 128)
            for bn in (32, 64, 128)
            for warps in (4, 8)
            for stages in (2, 3)
        ]
    for cfg in configs:

        def run(cfg: PrefillConfig = cfg) -> torch.Tensor:
            return paged_attention_triton(
                batch.q,
                batch.k_cache,
                batch.v_cache,
                batch.block_tables,
                batch.seq_lens,
                batch.query_start_loc,
                scale,
                batch.max_query_len,
                batch.max_seq_len,
                config=cfg,
            )

        try:
            ms = median_ms(run)
        except Exception as ex:  # a config that does not fit (shared memory) is reported
            print(f"prefill {label} {cfg}: failed {str(ex)[:100]}")
            continue
        name = (
            f"triton {cfg.variant.value} bm={cfg.block_m} bn={cfg.block_n} "
            f"w={cfg.num_warps} st={cfg.num_stages}"
        )
        rate = f"{flops / (ms * 1e-3) / 1e12:.0f} TFLOP/s"
        print(f"prefill {label} {name}: {ms * 1e3:.1f} us, {rate}", flush=True)
        rows.append((f"prefill {label}", name, ms, rate, ""))
    new_kv = fused_new_kv(batch)  # the extend kernel: new keys from fused qkv rows (TMA)
    forms: list[tuple[str, Callable[[], object]]] = [
        ("triton extend (new keys from qkv rows)", lambda: extend_attention_triton(
            batch.q, batch.k_cache, batch.v_cache, new_kv, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, scale, batch.max_seq_len, hopper=False,
        )),
    ]  # fmt: skip
    if hopper_prefill_ok(batch.q, batch.k_cache, new_kv, 0, False):
        out = torch.empty_like(batch.q)
        for pingpong, pack in ((True, 1), (False, 1), (True, 2)):

            def hopper(p: bool = pingpong, k: int = pack) -> object:
                return prefill_attention_hopper(
                    batch.q, batch.k_cache, batch.v_cache, new_kv, batch.block_tables,
                    batch.seq_lens, batch.query_start_loc, scale, out, pingpong=p, pack=k,
                )  # fmt: skip

            forms.append((f"gluon hopper prefill pingpong={pingpong} pack={pack}", hopper))
    for name, call in forms:
        ms = median_ms(call)
        rate = f"{flops / (ms * 1e-3) / 1e12:.0f} TFLOP/s"
        print(f"prefill {label} {name}: {ms * 1e3:.1f} us, {rate}", flush=True)
        rows.append((f"prefill {label}", name, ms, rate, ""))
    if all(ctx == 0 for ctx, _ in lens) and len({new for _, new in lens}) == 1:
        num_seqs, new = len(lens), lens[0][1]
        q4 = batch.q.view(num_seqs, new, NUM_Q_HEADS, HEAD_DIM).transpose(1, 2)
        k4 = torch.randn(num_seqs, NUM_KV_HEADS, new, HEAD_DIM, dtype=DTYPE, device="cuda")
        k_full = k4.repeat_interleave(NUM_Q_HEADS // NUM_KV_HEADS, dim=1)  # no enable_gqa
        # cuDNN's Hopper kernel (the warp specialization Triton lacks): a candidate (issue 9)
        backends = (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION))
        for (name, backend), (keys, gqa) in itertools.product(backends, ((k4, 1), (k_full, 0))):

            def sdpa(b: SDPBackend = backend, k: torch.Tensor = keys, g: int = gqa) -> None:
                with sdpa_kernel(b):
                    F.scaled_dot_product_attention(q4, k, k, is_causal=True, enable_gqa=bool(g))

            try:
                ms = median_ms(sdpa)
            except RuntimeError as ex:
                print(f"prefill {label} sdpa[{name}] gqa={gqa}: failed {str(ex)[:100]}")
                continue
            rate = f"{flops / (ms * 1e-3) / 1e12:.0f} TFLOP/s"
            print(f"prefill {label} torch sdpa[{name}] gqa={gqa}: {ms * 1e3:.1f} us, {rate}")
            rows.append((f"prefill {label}", f"torch sdpa[{name}] gqa={gqa}", ms, rate, ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sweep", action="store_true", help="time many decode launch configs")
    parser.add_argument(
        "--sweep-variants", action="store_true", help="time every kernel variant, print BEST lines"
    )
    parser.add_argument("--prefill", action="store_true", help="only the prefill rows")
    args = parser.parse_args()
    copy_bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {copy_bw / 1e12:.2f} TB/s (read + write)")
    if args.sweep_variants:
        sweep_variants(copy_bw)
        return
    rows: list[Row] = []
    if not args.prefill:
        run_decode(256, 1024, copy_bw, args.sweep, rows)
        for num_seqs, context in ((64, 4096), (8, 16384), (1, 32768)):
            run_decode(num_seqs, context, copy_bw, args.sweep and num_seqs == 1, rows)
        run_decode_mixed(copy_bw, rows)
    run_prefill([(0, 2048)] * 4, "4 x 2048 new", rows, args.sweep)
    run_prefill([(0, 512)] * 16, "16 x 512 new", rows)
    run_prefill([(1536, 512)] * 8, "8 x (1536 cached + 512 new)", rows)
    run_prefill([(0, 1000), (300, 77), (2000, 1), (0, 5)] * 4, "16 mixed", rows)
    run_prefill([(1000, 5)] * 256, "verify 256 x (1000 + 5)", rows)  # a speculative step's
    print(f"\n{'workload':<34} {'kernel':<46} {'us':>9} {'rate':>14} {'copy':>5}")
    for workload, kernel, ms, rate, frac in rows:
        print(f"{workload:<34} {kernel:<46} {ms * 1e3:>9.1f} {rate:>14} {frac:>5}")


if __name__ == "__main__":
    main()
