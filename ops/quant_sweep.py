"""Decode GEMV variants (kernels/quant_half2.py's half2 GEMVs and the byte GEMV of
quant_gemv.py) x launch configs on the Llama-3.1-8B step of ops/quant_bench.py (all 32 layers'
linears + lm_head, CUDA graph replays):

    python -m troupe.ops.quant_bench --sweep-variants            # rows 1 and 4
    python -m troupe.ops.quant_bench --sweep-variants --rows 1   # one row only

One table row per (form, variant, config, x rows): step time, weight bytes per step against
the copy bandwidth, speed-up over bf16 (torch linear, same step), and the relative error
(max |y - ref| / max |y_ref|) of the gate_up layer against the dequantized torch reference,
on the GPU; an error over 2e-2 marks the row WRONG (bf16 output rounding is ~4e-3). A config
that raises (out of resources, compile error) is printed and skipped. At the end one
`BEST <form>/<variant> <config> <time> ...` line per form and row count, over correct rows,
and the kernels/quant_gemv.py line that makes the best at one row the engine's default;
`PDL <form> default` lines: the engine default's step time with pdl off and on.
Nine configs a row count (each form's two variants, half2 also at 8 W rows per program; with
programmatic dependent launch (config.pdl, kernels/gemv_pdl.py): each form's engine default
and fp8 half2 n4), one timed graph each (a half2 config that splits K on some layers compiles
twice: fp32 partials). The error is the worse of the eager gate_up and the one the graph's
replays wrote (layer 0's gate_up inside the timed step). The GEMVs serve one row of x: at
2-16 rows every config of both forms runs the skinny kernels (fp8 with narrow scale blocks:
its byte GEMV), which have no PDL, so those rows repeat one another (the sweep of session 13,
before the dispatch moved, is what showed HALF2 at 3-6x the skinny time there). The int4
skinny kernel's own tiles: ops/int4_skinny_sweep.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from troupe.kernels.quant_gemv import (
    FP8_GEMV,
    INT4_GEMV,
    fp8_matmul,
    fp8_reference,
    int4_matmul,
    int4_reference,
)
from troupe.kernels.quant_gemv_config import Fp8Gemv, Fp8GemvConfig, Int4Gemv, Int4GemvConfig
from troupe.ops.quant_bench import GROUP, HIDDEN, INTER, Fp8W, Int4W, timed

WRONG = 2e-2
PDL = (False, True)
GemvConfig = Int4GemvConfig | Fp8GemvConfig

# HALF2 (quant_half2.py): (block_n, groups of 32 per row per iteration, warps, K splits (0:
# quant_half2.launch_shape)); groups = 32 x warps gives each thread every row of its tile.
# The first row is the engine's default; then BYTES for comparison.
INT4_CONFIGS = [
    Int4GemvConfig(Int4Gemv.HALF2, block_n, groups, warps, k_splits=splits)
    for block_n, groups, warps, splits in ((4, 128, 4, 0), (8, 128, 4, 0))
] + [Int4GemvConfig(Int4Gemv.BYTES)]
# programmatic dependent launch (kernels/gemv_pdl.py): each form's engine default off and on,
# and fp8's half2; what it changes shows only over the whole step (129 kernels in one graph)
INT4_CONFIGS = list(dict.fromkeys(INT4_CONFIGS + [replace(INT4_GEMV, pdl=p) for p in PDL]))
# HALF2 as int4's (block_w int32 words per row per iteration: 4 x 32 x warps is one 16-byte
# block per thread and row, 8 x 32 x warps two; n4 is the engine's default); BYTES last
FP8_CONFIGS = [
    Fp8GemvConfig(Fp8Gemv.HALF2, block_n, block_w, warps, k_splits=splits)
    for block_n, block_w, warps, splits in ((4, 512, 4, 0), (8, 512, 4, 0))
] + [Fp8GemvConfig(Fp8Gemv.BYTES)]
FP8_CONFIGS = list(
    dict.fromkeys(
        FP8_CONFIGS
        + [replace(FP8_GEMV, pdl=p) for p in PDL]
        + [replace(FP8_CONFIGS[0], pdl=True)]  # half2 n4
    )
)


@dataclass(frozen=True)
class Result:
    form: str
    config: GemvConfig
    rows: int
    seconds: float
    error: float


def label(config: GemvConfig) -> str:
    pdl = "/pdl" if config.pdl else ""
    if config.variant in (Int4Gemv.BYTES, Fp8Gemv.BYTES):
        return "split-K" + pdl
    tile = config.groups if isinstance(config, Int4GemvConfig) else config.block_w
    unit = "g" if isinstance(config, Int4GemvConfig) else "w"
    split = f"/k{config.k_splits or 'auto'}"
    return f"n{config.block_n}/{unit}{tile}/warps{config.num_warps}{split}{pdl}"


def default_line(config: GemvConfig) -> str:
    """The kernels/quant_gemv.py line that makes `config` the engine's default."""
    pdl = ", pdl=True" if config.pdl else ""
    if isinstance(config, Int4GemvConfig):
        return (
            f"INT4_GEMV = Int4GemvConfig(Int4Gemv.{config.variant.name}, block_n="
            f"{config.block_n}, groups={config.groups}, num_warps={config.num_warps}, "
            f"k_splits={config.k_splits}{pdl})"
        )
    return (
        f"FP8_GEMV = Fp8GemvConfig(Fp8Gemv.{config.variant.name}, block_n={config.block_n}, "
        f"block_w={config.block_w}, num_warps={config.num_warps}, k_splits={config.k_splits}"
        f"{pdl})"
    )


Run = tuple[str, GemvConfig, Callable[[], torch.Tensor], Callable[[], None], list[torch.Tensor]]


def _runs(
    x: torch.Tensor, xs: dict[int, torch.Tensor], int4: list[Int4W], fp8: list[Fp8W]
) -> list[Run]:
    """(form, config, gate_up alone, the whole step, where the step leaves its first gate_up
    output: after the timing, the one the graph's replays wrote) for every config."""
    p, s, b = int4[2]  # gate_up
    q, sc = fp8[2]
    runs: list[Run] = []
    for c4 in INT4_CONFIGS:
        kept4: list[torch.Tensor] = []

        def one4(c: Int4GemvConfig = c4) -> torch.Tensor:
            return int4_matmul(x, p, s, b, GROUP, c)

        def step4(c: Int4GemvConfig = c4, kept: list[torch.Tensor] = kept4) -> None:
            kept.clear()
            for pk, sk, bk in int4:
                kept.append(int4_matmul(xs[pk.shape[1] * 2], pk, sk, bk, GROUP, c))
            del kept[3:]

        runs.append(("int4", c4, one4, step4, kept4))
    for c8 in FP8_CONFIGS:
        kept8: list[torch.Tensor] = []

        def one8(c: Fp8GemvConfig = c8) -> torch.Tensor:
            return fp8_matmul(x, q, sc, c)

        def step8(c: Fp8GemvConfig = c8, kept: list[torch.Tensor] = kept8) -> None:
            kept.clear()
            for qk, sk in fp8:
                kept.append(fp8_matmul(xs[qk.shape[1]], qk, sk, c))
            del kept[3:]

        runs.append(("fp8", c8, one8, step8, kept8))
    return runs


def sweep(
    dense: list[torch.Tensor], int4: list[Int4W], fp8: list[Fp8W], bw: float, rows_list: list[int]
) -> None:
    start = time.perf_counter()
    device = dense[0].device
    nbytes = {
        "int4": sum(p.numel() + s.numel() * 2 + b.numel() * 2 for p, s, b in int4),
        "fp8": sum(q.numel() + s.numel() * 4 for q, s in fp8),
    }
    results: list[Result] = []
    print(f"{'form':5} {'variant':11} {'config':30} {'rows':>4} {'time us':>9} {'copy':>5} "
          f"{'x bf16':>6} {'error':>8}")  # fmt: skip
    for rows in rows_list:
        xs = {k: torch.randn(rows, k, device=device, dtype=torch.bfloat16) for k in (HIDDEN, INTER)}

        def step_bf16(xs: dict[int, torch.Tensor] = xs) -> None:
            for w in dense:
                torch.nn.functional.linear(xs[w.shape[1]], w)

        t_bf16 = timed(step_bf16, device)
        print(f"bf16  {'torch':11} {'F.linear':30} {rows:4} {t_bf16 * 1e6:9.1f} "
              f"{sum(w.numel() * 2 for w in dense) / t_bf16 / bw:5.0%}")  # fmt: skip
        x = xs[HIDDEN]
        p, s, b = int4[2]  # gate_up
        want = {"int4": int4_reference(x.float(), p, s, b, GROUP)}
        q, sc = fp8[2]
        want["fp8"] = fp8_reference(x.float(), q, sc)
        runs = _runs(x, xs, int4, fp8)
        for form, config, one, step, kept in runs:
            head = f"{form:5} {config.variant.value:11} {label(config):30} {rows:4}"
            try:
                ref = want[form]
                err = float((one().float() - ref).abs().max() / ref.abs().max())
                t = timed(step, device)  # a capture that fails (PDL in a graph) lands below
                err = max(err, float((kept[2].float() - ref).abs().max() / ref.abs().max()))
            except Exception as exc:  # out of resources, a compile error: report, go on
                print(f"{head} FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                continue
            results.append(Result(form, config, rows, t, err))
            mark = "" if err <= WRONG else "  WRONG"
            print(f"{head} {t * 1e6:9.1f} {nbytes[form] / t / bw:5.0%} {t_bf16 / t:6.2f} "
                  f"{err:8.1e}{mark}")  # fmt: skip
        for form in ("int4", "fp8"):
            ok = [r for r in results if r.form == form and r.rows == rows and r.error <= WRONG]
            if ok:
                best = min(ok, key=lambda r: r.seconds)
                print(
                    f"BEST {form}/{best.config.variant.value} {label(best.config)}"
                    f" {best.seconds * 1e6:.1f}us rows {rows}: "
                    f"{nbytes[form] / best.seconds / bw:.0%} of copy, "
                    f"{t_bf16 / best.seconds:.2f}x bf16"
                )
        for form, default in (("int4", INT4_GEMV), ("fp8", FP8_GEMV)):
            at = {r.config: r.seconds for r in results if r.form == form and r.rows == rows}
            off, on = (at.get(replace(default, pdl=p)) for p in PDL)
            if off and on:
                print(f"PDL {form} default rows {rows}: off {off * 1e6:.1f}us, on "
                      f"{on * 1e6:.1f}us ({on / off - 1:+.1%})")  # fmt: skip
    for form in ("int4", "fp8"):
        ok = [r for r in results if r.form == form and r.rows == rows_list[0] and r.error <= WRONG]
        if ok:
            best = min(ok, key=lambda r: r.seconds)
            print(f"default for {form} (kernels/quant_gemv.py): {default_line(best.config)}")
    print(f"sweep took {time.perf_counter() - start:.0f} s")
