"""Probe (GPU): can the decode GEMMs' fixed ~6-8 us go, by fetching their weights early?

    python3 -m troupe.ops.gemm_prefetch_probe [--rows 64 128 256] [--context 512] [--layers 28]

Qwen3-0.6B's decode layer as a chain of kernels in one CUDA graph, `--layers` times with a
weight set per layer: RMSNorm -> qkv GEMM -> attention stand-in (reads rows x context x 4 KB
of "KV", as a layer's decode attention does) -> o GEMM -> RMSNorm -> gate_up GEMM -> SwiGLU ->
down GEMM. Variants of the same chain, timed with triton.testing.do_bench_cudagraph:

    cublas           torch's GEMMs (the engine today)
    cublas+l2        the kernel before each GEMM first asks L2 for that GEMM's weights
                     (prefetch_l2: cp.async.bulk.prefetch.L2, sm_90); o's by the attention
                     stand-in at its start
    cublas+l2-no-o   the same without o's (the attention's KV stream may evict them)
    triton           a Triton GEMM (split-K merged by the last arrival), best of a small
                     sweep per shape, no PDL
    triton+pdl       the same launched with PDL: the kernels before it let it launch at
                     their start, it waits (griddepcontrol.wait) before reading x
    triton+pdl+l2    and, before the wait, it asks L2 for its own weights

Prints the chain's time per variant and what each saves per GEMM against cublas, and each
variant's relative error against cublas's chain (28 layers without residuals amplify rounding
differences: a Triton GEMM's differ from cuBLAS's; each tile is checked alone first). Measured
on an H200 (docs/benchmarks.md, session 42): no variant wins; the lead is closed.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from troupe.kernels.arrival import arrival_counters, reset_arrival
from troupe.kernels.gemv_pdl import GDC, OFF, pdl_start, pdl_wait

HIDDEN, Q, KV, INTER = 1024, 2048, 1024, 3072  # Qwen3-0.6B: q 16 x 128, kv 8 x 128


@triton.jit
def prefetch_l2(base_ptr, nbytes, pid, programs, CHUNKS: tl.constexpr, ON: tl.constexpr):
    """Program `pid` of `programs` asks L2 for its share of [base_ptr, base_ptr + nbytes): CHUNKS
    pieces of a 16-byte multiple each (base_ptr a byte pointer, 16-byte aligned)."""
    if ON:
        pieces = programs.to(tl.int64) * CHUNKS
        share = ((nbytes + pieces - 1) // pieces + 15) // 16 * 16
        start = (pid.to(tl.int64) * CHUNKS + tl.arange(0, CHUNKS)) * share
        size = tl.minimum(tl.maximum(nbytes - start, 0), share).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.u32 p, $2, 0; "
            "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r",
            [base_ptr + start, size],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


def weight_bytes(weight: torch.Tensor | None, stand_in: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A weight as the (byte view, byte count) prefetch_l2 takes; for None, (stand_in, 0):
    nothing to fetch (stand_in: any tensor on the kernel's device)."""
    if weight is None:
        return stand_in.view(-1).view(torch.uint8), 0
    if not weight.is_contiguous():
        raise ValueError("prefetch_l2: the weight must be contiguous")
    return weight.view(-1).view(torch.uint8), weight.numel() * weight.element_size()


def chunks_for(nbytes: int, programs: int) -> int:
    """Pieces a program issues: ~64 KB or less each, at most 16, a power of two."""
    per_program = -(-max(nbytes, 1) // max(programs, 1))
    return min(16, 1 << (-(-per_program // 65536) - 1).bit_length())


SHAPES = {"qkv": (Q + KV, HIDDEN), "o": (HIDDEN, Q), "gate_up": (2 * INTER, HIDDEN),
          "down": (HIDDEN, INTER)}  # fmt: skip


@triton.jit
def _norm_kernel(x_ptr, out_ptr, nxt_ptr, nxt_bytes, COLS: tl.constexpr, CHUNKS: tl.constexpr,
                 L2: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    prefetch_l2(nxt_ptr, nxt_bytes, tl.program_id(0), tl.num_programs(0), CHUNKS, L2)
    offs = tl.arange(0, COLS)
    h = tl.load(x_ptr + row * COLS + offs).to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, axis=0) / COLS + 1e-6)
    tl.store(out_ptr + row * COLS + offs, h.to(tl.bfloat16))


@triton.jit
def _swiglu_kernel(x_ptr, out_ptr, nxt_ptr, nxt_bytes, INTER_: tl.constexpr, BLOCK: tl.constexpr,
                   CHUNKS: tl.constexpr, L2: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    prefetch_l2(nxt_ptr, nxt_bytes, tl.program_id(0), tl.num_programs(0), CHUNKS, L2)
    offs = tl.arange(0, BLOCK)
    ok = offs < INTER_
    g = tl.load(x_ptr + row * 2 * INTER_ + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * INTER_ + INTER_ + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * INTER_ + offs, (g * tl.sigmoid(g) * u).to(tl.bfloat16), mask=ok)


@triton.jit
def _attention_stand_in(qkv_ptr, kv_ptr, out_ptr, context, nxt_ptr, nxt_bytes,
                        QW: tl.constexpr, QKVW: tl.constexpr, BLOCK: tl.constexpr,
                        CHUNKS: tl.constexpr, L2: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """Row r reads `context` x 4 KB of kv (its own stretch) and writes q + a sum of it."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    prefetch_l2(nxt_ptr, nxt_bytes, tl.program_id(0), tl.num_programs(0), CHUNKS, L2)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    base = kv_ptr + row * context * 2048  # 2,048 bf16 a token: 8 kv heads x 128 x (k, v)
    for t in range(0, context * 2048, BLOCK):
        acc += tl.load(base + t + tl.arange(0, BLOCK), eviction_policy="evict_first").to(tl.float32)
    s = tl.sum(acc, axis=0) * 1e-6
    offs = tl.arange(0, QW)
    q = tl.load(qkv_ptr + row * QKVW + offs).to(tl.float32)
    tl.store(out_ptr + row * QW + offs, (q + s).to(tl.bfloat16))


@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(x_ptr, w_ptr, out_ptr, part_ptr, counter_ptr, M, N, K, k_per_split, splits,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
                 STAGES: tl.constexpr, PDL: tl.constexpr, L2: tl.constexpr):  # fmt: skip
    """out [M, N] = x [M, K] @ w [N, K]^T; grid (N / BN, cdiv(M, BM), splits)."""
    pdl_start(PDL)
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rn = pid_n * BN + tl.arange(0, BN)
    k_start = pid_k * k_per_split
    if L2:  # this program's weight rows, its K range: one bulk prefetch a row
        row_at = w_ptr.to(tl.pointer_type(tl.uint8)) + (rn.to(tl.int64) * K + k_start) * 2
        tl.inline_asm_elementwise(
            "{ cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }", "=r,l,r",
            [row_at, tl.zeros((BN,), tl.int32) + k_per_split * 2], dtype=tl.int32,
            is_pure=False, pack=1,
        )  # fmt: skip
    pdl_wait(PDL)
    rm = pid_m * BM + tl.arange(0, BM)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in tl.range(k_start, k_start + k_per_split, BK, num_stages=STAGES):
        rk = k0 + tl.arange(0, BK)
        x = tl.load(x_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], mask=(rm < M)[:, None],
                    other=0.0)  # fmt: skip
        w = tl.load(w_ptr + rn[None, :].to(tl.int64) * K + rk[:, None])
        acc += tl.dot(x, w)
    tile = rm[:, None].to(tl.int64) * N + rn[None, :]
    ok = (rm < M)[:, None]
    if SPLIT:
        tl.store(part_ptr + pid_k.to(tl.int64) * M * N + tile, acc, mask=ok)
        tl.debug_barrier()
        count_ptr = counter_ptr + pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu") == splits - 1:
            tl.debug_barrier()
            total = tl.zeros((BM, BN), dtype=tl.float32)
            for k in range(0, splits):
                at = part_ptr + k * M.to(tl.int64) * N + tile
                total += tl.load(at, mask=ok, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + tile, total.to(tl.bfloat16), mask=ok)
            reset_arrival(count_ptr)
    else:
        tl.store(out_ptr + tile, acc.to(tl.bfloat16), mask=ok)


class Tile(NamedTuple):
    bm: int
    bn: int
    bk: int
    split: int
    stages: int = 3
    warps: int = 4


def triton_linear(x: torch.Tensor, w: torch.Tensor, tile: Tile, pdl: int, l2: bool,
                  part: torch.Tensor) -> torch.Tensor:  # fmt: skip
    m, k = x.shape
    n = w.shape[0]
    per_split = k // tile.split
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (n // tile.bn, triton.cdiv(m, tile.bm), tile.split)
    counters = arrival_counters(grid[0] * grid[1], x.device)
    _gemm_kernel[grid](
        x, w, out, part, counters, m, n, k, per_split, tile.split, tile.bm, tile.bn, tile.bk,
        tile.split > 1, tile.stages, pdl, l2, num_warps=tile.warps, launch_pdl=pdl == GDC,
    )  # fmt: skip
    return out


class Variant(NamedTuple):
    name: str
    gemm: str  # "cublas" | "triton"
    l2_before: bool  # the kernel before each GEMM prefetches its weights
    l2_o: bool  # and the attention stand-in o's
    pdl: bool
    l2_self: bool  # the Triton GEMM prefetches its own before the wait


VARIANTS = [
    Variant("cublas", "cublas", False, False, False, False),
    Variant("cublas+l2", "cublas", True, True, False, False),
    Variant("cublas+l2-no-o", "cublas", True, False, False, False),
    Variant("triton", "triton", False, False, False, False),
    Variant("triton+pdl", "triton", False, False, True, False),
    Variant("triton+pdl+l2", "triton", False, False, True, True),
]


def tiles_for(rows: int) -> list[Tile]:
    bms = [bm for bm in (64, 128) if bm <= max(rows, 64)]
    return [Tile(bm, bn, bk, sp) for bm in bms for bn in (64, 128) for bk in (64, 128)
            for sp in (1, 2, 4)]  # fmt: skip


def best_tiles(rows: int, layers: int, part: torch.Tensor) -> dict[str, Tile]:
    """The fastest correct tile per shape: `layers` GEMMs of it back to back in a graph."""
    dev = part.device
    best: dict[str, Tile] = {}
    for name, (n, k) in SHAPES.items():
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.03 for _ in range(layers)]
        x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
        ref = torch.nn.functional.linear(x, ws[0]).float()
        cub = triton.testing.do_bench_cudagraph(
            lambda x=x, ws=ws: [torch.nn.functional.linear(x, w) for w in ws]) * 1e3  # fmt: skip
        timed = []
        for tile in tiles_for(rows):
            if (k // tile.split) % tile.bk:
                continue
            got = triton_linear(x, ws[0], tile, OFF, False, part).float()
            if ((got - ref).abs().max() / ref.abs().max()).item() > 2e-2:
                print(f"  {name} {tile}: wrong")
                continue
            t = triton.testing.do_bench_cudagraph(
                lambda tile=tile, x=x, ws=ws: [triton_linear(x, w, tile, OFF, False, part)
                                               for w in ws]) * 1e3  # fmt: skip
            timed.append((t, tile))
        t, best[name] = min(timed)
        print(f"rows {rows:>3} {name:>7} x{layers}: cuBLAS {cub:6.1f} us, Triton best {t:6.1f} us "
              f"{best[name]}", flush=True)  # fmt: skip
    return best


class Layer(NamedTuple):
    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def chain(v: Variant, layers: list[Layer], h: torch.Tensor, kv: torch.Tensor, context: int,
          tiles: dict[str, Tile], part: torch.Tensor) -> Callable[[], torch.Tensor]:  # fmt: skip
    rows = h.shape[0]
    pdl = GDC if v.pdl else OFF

    def gemm(x: torch.Tensor, w: torch.Tensor, name: str) -> torch.Tensor:
        if v.gemm == "cublas":
            return torch.nn.functional.linear(x, w)
        return triton_linear(x, w, tiles[name], pdl, v.l2_self, part)

    def nxt(w: torch.Tensor, on: bool) -> dict[str, object]:
        at, nbytes = weight_bytes(w if on else None, h)
        return {"nxt_ptr": at, "nxt_bytes": nbytes, "CHUNKS": chunks_for(nbytes, rows), "L2": on,
                "PDL": pdl, "num_warps": 4}  # fmt: skip

    def run() -> torch.Tensor:
        x = h
        for lw in layers:
            a = torch.empty(rows, HIDDEN, device=h.device, dtype=h.dtype)
            _norm_kernel[(rows,)](x, a, COLS=HIDDEN, **nxt(lw.qkv, v.l2_before))
            qkv = gemm(a, lw.qkv, "qkv")
            att = torch.empty(rows, Q, device=h.device, dtype=h.dtype)
            _attention_stand_in[(rows,)](
                qkv, kv, att, context, QW=Q, QKVW=Q + KV, BLOCK=2048, **nxt(lw.o, v.l2_o)
            )
            o = gemm(att, lw.o, "o")
            b = torch.empty(rows, HIDDEN, device=h.device, dtype=h.dtype)
            _norm_kernel[(rows,)](o, b, COLS=HIDDEN, **nxt(lw.gate_up, v.l2_before))
            gu = gemm(b, lw.gate_up, "gate_up")
            s = torch.empty(rows, INTER, device=h.device, dtype=h.dtype)
            _swiglu_kernel[(rows,)](gu, s, INTER_=INTER, BLOCK=4096, **nxt(lw.down, v.l2_before))
            x = gemm(s, lw.down, "down")
        return x

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--context", type=int, default=512, help="KV tokens a row reads a layer")
    p.add_argument("--layers", type=int, default=28)
    args = p.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), f"layers {args.layers}, context {args.context}")
    layers = [Layer(*(torch.randn(*SHAPES[n], device=dev, dtype=torch.bfloat16) * 0.03
                      for n in ("qkv", "o", "gate_up", "down"))) for _ in range(args.layers)]  # fmt: skip
    for rows in args.rows:
        part = torch.empty(4 * rows * 2 * INTER, device=dev, dtype=torch.float32)
        tiles = best_tiles(rows, args.layers, part)
        kv = torch.randn(rows * args.context * 2048, device=dev, dtype=torch.bfloat16)
        h = torch.randn(rows, HIDDEN, device=dev, dtype=torch.bfloat16)
        ref = chain(VARIANTS[0], layers, h, kv, args.context, tiles, part)().float()
        base = None
        for v in VARIANTS:
            run = chain(v, layers, h, kv, args.context, tiles, part)
            err = ((run().float() - ref).abs().max() / ref.abs().max()).item()
            t = triton.testing.do_bench_cudagraph(run) * 1e3
            base = t if base is None else base
            saved = (base - t) / (4 * args.layers)
            print(f"rows {rows:>3} {v.name:>16}: {t:8.1f} us a chain, {saved:+5.2f} us a GEMM "
                  f"against cublas (err {err:.1e})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
