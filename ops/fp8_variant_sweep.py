"""The fp8-KV decode kernel's launch configs on an H200, for fp8_kv_bench --sweep-variants.

Shapes of issue #12 (Llama-3.1-8B heads: 32 q / 8 kv, head_dim 128, block_size 16):
256x1024, 64x4096, 16x16384 (sequences x context). Every row is checked against the torch
reference on the GPU (relative norm error and max abs error; rows over 1e-2 are marked WRONG
and never BEST) and timed; bandwidth counts K and V in the cache's bytes plus q and out, as
`attention` does. A failing launch (out of shared memory, a compile error) prints its exception
and the sweep goes on. Candidates run in priority order and the ones left after TIME_BUDGET_S
are listed as skipped, so the whole run stays within about 80 s with compiles.

BEST is the fp8 candidate correct on every shape with the highest mean % of copy; the line to
paste as FP8_DEFAULT_CONFIG in kernels/decode_attention.py follows it. The kernel variants this
sweep once compared lost and were removed (figures: docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch
import triton
from troupe.kernels import reference
from troupe.kernels.decode_attention import DecodeConfig, paged_decode_attention_triton
from troupe.kernels.fp8_tile import Fp8Convert
from troupe.kernels.kv_quant import quantize
from troupe.kernels.paged_batch import PagedBatch, make_paged_batch

SHAPES = ((256, 1024), (64, 4096), (16, 16384))
TIME_BUDGET_S = 60.0  # after this no new candidate starts (each costs ~2 compiles + timing)
MAX_REL_ERR = 1e-2
# (kind, config) in priority order; "bf16" is the bf16-cache reference row (never BEST)
CANDIDATES: list[tuple[str, DecodeConfig]] = [
    ("bf16", DecodeConfig()),
    ("fp8", DecodeConfig(64, 2, 5)),  # today's fp8 default: two 64-key tiles in flight
    ("fp8", DecodeConfig(128, 2, 3)),  # the default before session 46: one 128-key tile
    # the tiles converted where loaded (kernels/fp8_tile.py): no byte reads of shared memory,
    # ~0.09 warp instructions a KV byte against 0.125 (ops/fp8_compile_check, 2026-12-05)
    ("fp8", DecodeConfig(128, 4, 2, fp8_convert=Fp8Convert.V_AT_LOAD)),
    ("fp8", DecodeConfig(128, 4, 3, fp8_convert=Fp8Convert.KV_AT_LOAD)),
    ("fp8", DecodeConfig(64, 4, 3, fp8_convert=Fp8Convert.V_AT_LOAD)),
    ("fp8", DecodeConfig(128, 8, 3, fp8_convert=Fp8Convert.KV_AT_LOAD)),
    ("fp8", DecodeConfig(128, 4, 2, programs_per_sm=3, fp8_convert=Fp8Convert.V_AT_LOAD)),
]


@dataclasses.dataclass
class _Shape:
    name: str
    batch: PagedBatch
    k8: torch.Tensor
    v8: torch.Tensor
    scales: torch.Tensor
    ref_bf16: torch.Tensor
    ref_fp8: torch.Tensor


def fp8_decode_batch(
    num_seqs: int, context: int
) -> tuple[PagedBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Llama-3.1-8B heads on CUDA, one decode token per sequence: the bf16 batch, its caches in
    fp8 (scale 1/64 per KV head) and the scales."""
    batch = make_paged_batch(
        [(context - 1, 1)] * num_seqs, num_q_heads=32, num_kv_heads=8, head_dim=128,
        block_size=16, dtype=torch.bfloat16, device="cuda", seed=0, poison=False,
    )  # fmt: skip
    scales = torch.full((8,), 1 / 64, device="cuda")
    k8 = quantize(batch.k_cache.flatten(0, 1), scales).view(batch.k_cache.shape)
    v8 = quantize(batch.v_cache.flatten(0, 1), scales).view(batch.v_cache.shape)
    return batch, k8, v8, scales


def _shape(num_seqs: int, context: int) -> _Shape:
    batch, k8, v8, scales = fp8_decode_batch(num_seqs, context)
    rest = (batch.block_tables, batch.seq_lens, 1 / math.sqrt(128), batch.max_seq_len)
    ref_bf16 = reference.paged_decode_attention(batch.q, batch.k_cache, batch.v_cache, *rest)
    ref_fp8 = reference.paged_decode_attention(
        batch.q, k8, v8, *rest, k_scale=scales, v_scale=scales
    )
    return _Shape(f"{num_seqs}x{context}", batch, k8, v8, scales, ref_bf16, ref_fp8)


def describe(config: DecodeConfig) -> str:
    text = f"bn={config.block_n} w={config.num_warps} st={config.num_stages}"
    if config.programs_per_sm != 2 or config.min_split != 256:
        text += f" waves={config.programs_per_sm} minsplit={config.min_split}"
    if config.fp8_convert is not Fp8Convert.AT_DOT:
        text += f" {config.fp8_convert.value}"
    return text


def _run(kind: str, config: DecodeConfig, shape: _Shape, copy_bw: float) -> tuple[float, float]:
    """(% of copy, relative error) of one candidate on one shape; prints its row."""
    b = shape.batch
    if kind == "bf16":
        k, v, scales, ref = b.k_cache, b.v_cache, None, shape.ref_bf16
    else:
        k, v, scales, ref = shape.k8, shape.v8, shape.scales, shape.ref_fp8

    def call() -> torch.Tensor:
        return paged_decode_attention_triton(
            b.q, k, v, b.block_tables, b.seq_lens, 1 / math.sqrt(128), b.max_seq_len,
            config=config, k_scale=scales, v_scale=scales,
        )  # fmt: skip

    out = call().float()
    torch.cuda.synchronize()
    rel = float((out - ref.float()).norm() / ref.float().norm())
    max_abs = float((out - ref.float()).abs().max())
    ms = float(triton.testing.do_bench(call, warmup=5, rep=25, return_mode="median"))
    tokens = int(b.seq_lens.sum())
    nbytes = 2 * tokens * 8 * 128 * k.element_size() + 4 * b.q.numel()
    pct = nbytes / (ms * 1e-3) / copy_bw * 100
    name = "bf16-kv" if kind == "bf16" else "fp8-kv"
    mark = "" if rel <= MAX_REL_ERR and not math.isnan(rel) else "  WRONG"
    print(
        f"{name:<18} {describe(config):<34} {shape.name:<9} {ms * 1e3:9.1f} {pct:7.1f}% "
        f"{rel:9.2e} {max_abs:9.2e}{mark}",
        flush=True,
    )
    return pct, rel


def sweep_variants(copy_bw: float) -> None:
    start = time.perf_counter()
    shapes = [_shape(n, c) for n, c in SHAPES]
    print(f"copy {copy_bw / 1e12:.2f} TB/s; shapes ready in {time.perf_counter() - start:.1f} s")
    print(
        f"{'variant':<18} {'config':<34} {'shape':<9} {'time(us)':>9} {'%copy':>8} "
        f"{'rel err':>9} {'max abs':>9}"
    )
    summary: list[tuple[float, str, DecodeConfig, list[float]]] = []
    for i, (kind, config) in enumerate(CANDIDATES):
        if time.perf_counter() - start > TIME_BUDGET_S:
            for kind_left, config_left in CANDIDATES[i:]:
                print(f"skipped (time budget): {kind_left} {describe(config_left)}")
            break
        pcts: list[float] = []
        try:
            for shape in shapes:
                pct, rel = _run(kind, config, shape, copy_bw)
                if not rel <= MAX_REL_ERR:
                    raise ValueError(f"{shape.name}: relative error {rel:.2e}")
                pcts.append(pct)
        except Exception as exc:  # a variant's failure is a row of the table, not the end
            print(f"FAILED {kind} {describe(config)}: "
                  f"{type(exc).__name__}: {str(exc)[:300]}")  # fmt: skip
            continue
        if kind == "fp8":
            summary.append((sum(pcts) / len(pcts), kind, config, pcts))
    print(f"sweep took {time.perf_counter() - start:.1f} s")
    if not summary:
        print("BEST none (no fp8 candidate was correct on every shape)")
        return
    for mean, _, config, pcts in sorted(summary, key=lambda row: -row[0]):
        per_shape = " / ".join(f"{p:.0f}%" for p in pcts)
        print(f"mean {mean:5.1f}%  ({per_shape})  {describe(config)}")
    mean, _, best, pcts = max(summary, key=lambda row: row[0])
    print(f"BEST {describe(best).replace(' ', ',')} {mean:.1f}% of copy (mean)")
    print(
        f"FP8_DEFAULT_CONFIG = DecodeConfig({best.block_n}, {best.num_warps}, "
        f"{best.num_stages}, min_split={best.min_split}, "
        f"programs_per_sm={best.programs_per_sm}, fp8_convert=Fp8Convert.{best.fp8_convert.name})"
    )
