"""Attention kernel variants x launch configs on the H200 shapes of issue #9 (GPU).

    python3 -m troupe.ops.kernel_bench --sweep-variants

Decode: every DecodeVariant x launch x split policy on the four decode shapes of kernel_bench
(256 x 1,024 ... 1 x 32,768), as % of copy bandwidth, next to torch flash SDPA on contiguous KV.
Prefill: every PrefillVariant x launch at 4 x 2,048 new tokens, in TFLOP/s. Every row is checked
on the GPU against the fp32 torch reference (relative error; WRONG above 1e-2). A config that
fails (shared memory, compile) prints its error and the sweep goes on. The end prints

    BEST decode <variant> <config> <% of copy at 1 x 32,768>   (correct, >= flash on every shape)
    BEST prefill <variant> <config> <TFLOP/s>

and the DEFAULT_CONFIG line to paste into kernels/decode_attention.py / paged_attention.py.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from collections.abc import Callable

import torch
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
from troupe.kernels import reference
from troupe.kernels.decode_attention import (
    DecodeConfig,
    DecodeVariant,
    paged_decode_attention_triton,
)
from troupe.kernels.paged_attention import (
    PrefillConfig,
    PrefillVariant,
    paged_attention_triton,
)
from troupe.kernels.paged_batch import PagedBatch, make_paged_batch

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 16, 8, 128, 16
DTYPE = torch.bfloat16
DECODE_SHAPES = ((256, 1024), (64, 4096), (8, 16384), (1, 32768))
PREFILL_LENS = [(0, 2048)] * 4
DECODE_LAUNCHES = ((64, 4, 3), (128, 4, 3))  # block_n, num_warps, num_stages
# programs per SM, max splits, min tokens per split (the first is today's policy)
SPLIT_POLICIES = ((2, 32, 256), (4, 128, 256), (8, 256, 128))
# BASE runs today's launch only (kernel_bench --sweep already covered its launches)
PREFILL_LAUNCHES = ((64, 64, 4, 2), (128, 64, 8, 3), (128, 128, 8, 3))
MAX_ERR = 1e-2
DEVICE = "cuda"  # a dry run on the CPU (TRITON_INTERPRET=1) patches this and the shapes


def _ms(fn: Callable[[], object]) -> float:
    return float(triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median"))


def config_code(cfg: object) -> str:
    """The constructor call that rebuilds a config dataclass, enums by name."""
    parts = []
    for field in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, field.name)
        text = f"{type(value).__name__}.{value.name}" if isinstance(value, enum.Enum) else value
        parts.append(f"{field.name}={text}")
    return f"{type(cfg).__name__}({', '.join(parts)})"


def _batch(lens: list[tuple[int, int]], seed: int) -> PagedBatch:
    return make_paged_batch(
        lens, num_q_heads=NUM_Q_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM,
        block_size=BLOCK_SIZE, dtype=DTYPE, device=DEVICE, seed=seed, poison=False,
    )  # fmt: skip


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def _row(shape: str, variant: str, config: str, us: float, figure: str, err: float) -> None:
    flag = "" if err <= MAX_ERR else "  WRONG"
    print(f"{shape:<14} {variant:<9} {config:<34} {us:>9.1f} {figure:>13} {err:>9.1e}{flag}")


def _flash_decode_ms(num_seqs: int, context: int) -> float:
    q4 = torch.randn(num_seqs, NUM_Q_HEADS, 1, HEAD_DIM, dtype=DTYPE, device=DEVICE)
    k4 = torch.randn(num_seqs, NUM_KV_HEADS, context, HEAD_DIM, dtype=DTYPE, device=DEVICE)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return _ms(
            lambda: torch.nn.functional.scaled_dot_product_attention(q4, k4, k4, enable_gqa=True)
        )


def _decode_shape(
    num_seqs: int, context: int, copy_bw: float, configs: list[DecodeConfig]
) -> tuple[float, dict[DecodeConfig, float]]:
    """Times every config on one shape: flash SDPA's fraction of copy, each correct config's."""
    shape = f"{num_seqs}x{context}"
    batch = _batch([(context - 1, 1)] * num_seqs, seed=num_seqs + context)
    nbytes = 2 * num_seqs * context * NUM_KV_HEADS * HEAD_DIM * 2 + 2 * batch.q.numel() * 2
    scale = 1 / math.sqrt(HEAD_DIM)
    rows = min(num_seqs, 16)
    ref = reference.paged_decode_attention(
        batch.q[:rows].float(), batch.k_cache, batch.v_cache, batch.block_tables[:rows],
        batch.seq_lens[:rows], scale, context,
    )  # fmt: skip
    floor = 0.0
    try:
        ms = _flash_decode_ms(num_seqs, context)
        floor = nbytes / (ms * 1e-3) / copy_bw
        _row(shape, "sdpa", "flash, contiguous KV", ms * 1e3, f"{floor:.1%}", 0.0)
    except Exception as ex:  # a failing baseline is reported, not fatal
        print(f"{shape} sdpa flash failed: {str(ex)[:120]}")
    fracs: dict[DecodeConfig, float] = {}
    for cfg in configs:
        name = (
            f"bn={cfg.block_n} w={cfg.num_warps} st={cfg.num_stages} "
            f"pol={cfg.programs_per_sm}/{cfg.max_splits}/{cfg.min_split}"
        )

        def run(cfg: DecodeConfig = cfg) -> torch.Tensor:
            return paged_decode_attention_triton(
                batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                scale, context, config=cfg,
            )  # fmt: skip

        try:
            err = _rel(run()[:rows], ref)
            ms = _ms(run)
        except Exception as ex:  # out of shared memory etc.: go on
            print(f"{shape:<14} {cfg.variant.value:<9} {name}: failed {str(ex)[:120]}")
            continue
        frac = nbytes / (ms * 1e-3) / copy_bw
        _row(shape, cfg.variant.value, name, ms * 1e3, f"{frac:.1%}", err)
        if err <= MAX_ERR:
            fracs[cfg] = frac
    return floor, fracs


def sweep_decode(copy_bw: float) -> None:
    configs = [
        DecodeConfig(
            bn, w, st, variant, programs_per_sm=pps, max_splits=max_splits, min_split=min_split
        )
        for variant in DecodeVariant
        for bn, w, st in DECODE_LAUNCHES
        for pps, max_splits, min_split in SPLIT_POLICIES
    ]
    floors: dict[tuple[int, int], float] = {}
    fracs: dict[tuple[int, int], dict[DecodeConfig, float]] = {}
    for num_seqs, context in DECODE_SHAPES:
        key = (num_seqs, context)
        floors[key], fracs[key] = _decode_shape(num_seqs, context, copy_bw, configs)
        torch.cuda.empty_cache()
        if fracs[key]:
            cfg, frac = max(fracs[key].items(), key=lambda cf: cf[1])
            print(f"best decode {num_seqs}x{context}: {config_code(cfg)} {frac:.1%}")
    # correct on every shape and at least flash SDPA there; the best at 1 x 32,768 wins
    good = [c for c in configs if all(fracs[s].get(c, -1.0) >= floors[s] for s in DECODE_SHAPES)]
    if not good:
        print("BEST decode none: no config is correct and at least flash SDPA on every shape")
        return
    target = DECODE_SHAPES[-1]
    best = max(good, key=lambda c: fracs[target][c])
    print(f"BEST decode {best.variant.value} {config_code(best)} {fracs[target][best]:.1%}")
    print(f"  kernels/decode_attention.py: DEFAULT_CONFIG = {config_code(best)}")


def _flash_prefill_ms(q: torch.Tensor) -> float:
    q4 = q.view(len(PREFILL_LENS), -1, NUM_Q_HEADS, HEAD_DIM).transpose(1, 2)
    k4 = torch.randn(
        len(PREFILL_LENS), NUM_KV_HEADS, PREFILL_LENS[0][1], HEAD_DIM, dtype=DTYPE, device=DEVICE
    )
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return _ms(
            lambda: torch.nn.functional.scaled_dot_product_attention(
                q4, k4, k4, is_causal=True, enable_gqa=True
            )
        )


def sweep_prefill() -> None:
    batch = _batch(PREFILL_LENS, seed=len(PREFILL_LENS))
    scale = 1 / math.sqrt(HEAD_DIM)
    pairs = sum(new * ctx + new * (new + 1) // 2 for ctx, new in PREFILL_LENS)
    flops = 4 * pairs * NUM_Q_HEADS * HEAD_DIM
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, scale, batch.max_query_len, batch.max_seq_len)  # fmt: skip
    ref = reference.paged_attention(batch.q.float(), *args[1:])
    shape = f"{len(PREFILL_LENS)}x{PREFILL_LENS[0][1]}"
    try:
        ms = _flash_prefill_ms(batch.q)
        _row(shape, "sdpa", "flash, contiguous KV", ms * 1e3, f"{flops / ms / 1e9:.0f} TFLOP/s", 0)
    except Exception as ex:  # a failing baseline is reported, not fatal
        print(f"{shape} sdpa flash failed: {str(ex)[:120]}")
    results: list[tuple[float, PrefillConfig]] = []
    for variant in PrefillVariant:  # WS last: a compiler that cannot do it fails last
        if variant is PrefillVariant.WS and results:
            tflops, cfg = max(results, key=lambda tc: tc[0])
            print(f"best prefill before ws: {config_code(cfg)} {tflops:.0f} TFLOP/s")
        launches = PREFILL_LAUNCHES[:1] if variant is PrefillVariant.BASE else PREFILL_LAUNCHES
        for bm, bn, w, st in launches:
            cfg = PrefillConfig(bm, bn, w, st, variant)
            name = f"bm={bm} bn={bn} w={w} st={st}"

            def run(cfg: PrefillConfig = cfg) -> torch.Tensor:
                return paged_attention_triton(*args, config=cfg)

            try:
                err = _rel(run(), ref)
                ms = _ms(run)
            except Exception as ex:  # out of shared memory etc.: go on
                print(f"{shape:<14} {variant.value:<9} {name}: failed {str(ex)[:120]}")
                continue
            tflops = flops / ms / 1e9
            _row(shape, variant.value, name, ms * 1e3, f"{tflops:.0f} TFLOP/s", err)
            if err <= MAX_ERR:
                results.append((tflops, cfg))
    if not results:
        print("BEST prefill none: no correct config")
        return
    tflops, best = max(results, key=lambda tc: tc[0])
    print(f"BEST prefill {best.variant.value} {config_code(best)} {tflops:.0f} TFLOP/s")
    print(f"  kernels/paged_attention.py: DEFAULT_CONFIG = {config_code(best)}")


def sweep_variants(copy_bw: float) -> None:
    start = time.perf_counter()
    print(f"{'shape':<14} {'variant':<9} {'config':<34} {'us':>9} {'figure':>13} {'rel err':>9}")
    sections: list[Callable[[], None]] = [lambda: sweep_decode(copy_bw), sweep_prefill]
    for section in sections:
        try:
            section()
        except Exception as ex:  # one failing section still lets the other print
            print(f"sweep section failed: {ex!r}")
    print(f"sweep took {time.perf_counter() - start:.0f} s")
