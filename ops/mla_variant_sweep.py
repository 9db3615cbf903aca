"""The MLA decode kernel's launch configs at DeepSeek-V2-Lite shape (GPU), one table.

    python3 -m troupe.ops.mla_bench --sweep-variants

Every kernels/mla_decode.MlaLaunch below runs at 256 sequences x 1,024 tokens; today's default,
the best three and the best at 4 / 8 / 16 splits run again at 32 x 4,096 (unless a sticky CUDA
error ended the first table). Each row: the split count the config picks, the median kernel time, the rate over the bytes the kernel must move (latent cache rows once, q_lat,
q_rope, o_lat: ops/mla_bench.py's count) against copy bandwidth, and the error of o_lat against
a torch fp32 softmax over the same gathered latent rows, computed on the GPU for every row
(max abs and relative norm; rel > 2e-2 or a non-finite value marks the row WRONG). A config
that fails (out of shared memory, a compile error) prints its exception and the sweep goes on.
The last lines, `BEST <config> <figure>` per shape, name the fastest correct row and
the MlaLaunch to paste into kernels/mla_decode.DEFAULT_CONFIG.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch
import triton.testing
from troupe.kernels.mla_decode import (
    DEFAULT_CONFIG,
    MlaLaunch,
    choose_num_splits,
    mla_attention_triton,
)

HEADS, LORA, ROPE, NOPE, BLOCK_SIZE = 16, 512, 64, 128, 16
MAX_REL_ERROR = 2e-2
TIME_BUDGET_S = 75.0  # the sweep's share of the lead's combined H200 call: later configs skip


def _p(bn: int, warps: int, stages: int, pps: int) -> MlaLaunch:
    return MlaLaunch(block_n=bn, num_warps=warps, num_stages=stages, programs_per_sm=pps)


# programs_per_sm on 132 SMs at 256 rows: 3 -> 1 split, 4 -> 2, 6 -> 3, 8 -> 4. The H200 sweeps
# of 2026-12-02 (docs/benchmarks.md, also the figures of the variants since removed): bn 64 w4
# st2 pps3 (= DEFAULT_CONFIG) 90.7 us, 81% of copy; bn 32 w4 st3 pps4 102.1 us, 72%; pps16 62%,
# w8 53%.
# Compiled for sm_90 by triton 3.7 (`python3 -m troupe.ops.mla_compile_check`,
# no GPU; shared memory, registers, programs per SM by both, waves of programs at 256 rows):
#   bn 32 st3 (round 1's)   93 KB: c 2 x 32 x 512 (64 KB), k_r 2 x 32 x 64, q 16 x 512 (16 KB,
#                           the mma operand), 128 regs: 2 per SM; 2 splits = 1.94 waves,
#                           1 split (pps 3, no partials, no merge) 0.97, 3 splits 2.9
#   bn 16 st4               74 KB (3 tile buffers), 128 regs: 3 per SM; 3 splits (pps 6) 1.94
#   bn 16 st5               93 KB (4 buffers), 128 regs (166 at one split): 2 per SM
#   bn 16 st3               56 KB (2 buffers): 4 per SM; 4 splits (pps 8) 1.94 waves
#   bn 32 st4               130 KB (3 buffers): 1 per SM, the deepest pipeline at bn 32
#   bn 32 w8 st3            98 regs, 93 KB: 2 per SM of 8 warps
#   bn 64 w8 st3            168 KB (2 buffers), 102 regs: 1 per SM
#   bn 64 w4 st3 / st2      at one split (pps 3) 168 KB, 132 regs: 1 per SM, 1.94 waves / 94 KB
#                           (1 buffer), 190 regs: 2 per SM, 0.97 waves
#   bn 32 w2 st3            255 regs, an 8-byte spill: 2 per SM of 2 warps
# Each of the num_warps warps of an mma (m16, heads as rows) reads all of q from shared memory
# per tile: 4 x 18 KB per tile of BLOCK_N tokens (2.25 KB a token at bn 32, 4.5 at bn 16, 1.1
# at bn 64) next to the tile's own two reads (2.3 KB a token), a load on shared-memory bandwidth
# that grows with warps and shrinks with block_n (inferred from the mma layout, warps side by
# side over the tokens; not measured: w8 was slower, 53%).
# The exploration around the winner first (likeliest first: later rows skip past the time
# budget).
CONFIGS = [
    DEFAULT_CONFIG,
    _p(16, 4, 4, 6),  # deeper pipeline, smaller tiles, 3 per SM x 3 splits
    _p(32, 4, 3, 3),  # fewer splits: one, no merge
    _p(64, 4, 3, 3),  # bn 64: q (the mma's A, in shared memory) read per 64 tokens
    _p(16, 4, 5, 4),
    _p(16, 4, 3, 8),
    _p(32, 4, 3, 6),
    _p(16, 4, 4, 4),
    _p(32, 4, 4, 3),  # more stages at bn 32 (1 per SM)
    _p(32, 8, 3, 4),
    _p(64, 8, 3, 4),
    _p(32, 2, 3, 4),  # 2 warps: half the threads for the same accumulator
]


def config_expr(config: MlaLaunch) -> str:
    """The MlaLaunch(...) expression for the fields that differ from the dataclass default."""
    base = MlaLaunch()
    fields = [
        f"{f.name}={getattr(config, f.name)!s}"
        for f in dataclasses.fields(MlaLaunch)
        if getattr(config, f.name) != getattr(base, f.name)
    ]
    return f"MlaLaunch({', '.join(fields)})"


def _short(config: MlaLaunch) -> str:
    return (f"bn={config.block_n} w={config.num_warps} st={config.num_stages} "
            f"pps={config.programs_per_sm}")  # fmt: skip


def _problem(
    num_seqs: int, context: int, device: str, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(num_seqs + context)
    per_seq = -(-context // BLOCK_SIZE)
    num_blocks = num_seqs * per_seq
    order = torch.randperm(num_blocks, generator=gen, device=device)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    return {
        "cache": randn(num_blocks, BLOCK_SIZE, LORA + ROPE),
        "table": order.view(num_seqs, per_seq).to(torch.int32),
        "ctx": torch.full((num_seqs,), context, dtype=torch.int32, device=device),
        "q_lat": randn(num_seqs, HEADS, LORA, scale=0.5),
        "q_rope": randn(num_seqs, HEADS, ROPE),
        "seq": torch.arange(num_seqs, dtype=torch.int32, device=device),
    }


def _reference(p: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    """o_lat [S, H, L] in fp32: softmax over each sequence's gathered latent rows."""
    rows = p["cache"][p["table"].long()].flatten(1, 2)  # [S, ctx, L + R] (ctx a block multiple)
    out = torch.empty(p["q_lat"].shape, dtype=torch.float32, device=p["q_lat"].device)
    for lo in range(0, rows.shape[0], 32):  # bounded fp32 temporaries
        r = rows[lo : lo + 32].float()
        s = torch.einsum("shl,snl->shn", p["q_lat"][lo : lo + 32].float(), r[..., :LORA])
        s += torch.einsum("shr,snr->shn", p["q_rope"][lo : lo + 32].float(), r[..., LORA:])
        out[lo : lo + 32] = torch.einsum("shn,snl->shl", (s * scale).softmax(-1), r[..., :LORA])
    return out


Row = tuple[float, MlaLaunch]


def sweep_shape(
    num_seqs: int,
    context: int,
    configs: list[MlaLaunch],
    copy_bw: float,
    device: str = "cuda",
    timer: Callable[[Callable[[], torch.Tensor]], float] | None = None,
    deadline: float = float("inf"),
    dtype: torch.dtype = torch.bfloat16,
) -> list[Row]:
    """Print one table row per config; return (bandwidth, config) of the correct ones (sorted,
    fastest first). device/timer/dtype: a CPU smoke run of the table under TRITON_INTERPRET=1
    (in float32: the interpreter's bf16 arithmetic is not the GPU's)."""
    p = _problem(num_seqs, context, device, dtype)
    scale = (NOPE + ROPE) ** -0.5
    expected = _reference(p, scale)
    on_gpu = device == "cuda"
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count if on_gpu else 4
    moved = (p["cache"].numel() + 2 * p["q_lat"].numel() + p["q_rope"].numel()) * 2
    print(f"\n{num_seqs} x {context}: {moved / 1e6:.0f} MB to move")
    print(f"{'config':<24} {'splits':>6} {'us':>8} {'TB/s':>6} {'copy':>5} "
          f"{'max abs':>8} {'rel':>8}")  # fmt: skip
    good: list[Row] = []
    for config in configs:
        splits = choose_num_splits(num_seqs, 1, context, num_sms, config.programs_per_sm)

        def kernel(config: MlaLaunch = config) -> torch.Tensor:
            return mla_attention_triton(p["q_lat"], p["q_rope"], p["cache"], p["table"], p["seq"],
                                        p["ctx"], scale, config=config)  # fmt: skip

        head = f"{_short(config):<24} {splits:>6}"
        if time.monotonic() > deadline:
            print(f"{head} skipped (past the sweep's {TIME_BUDGET_S:.0f} s)")
            continue
        try:
            out = kernel().float()
            ms = (timer or _median_ms)(kernel)
        except Exception as exc:  # a tile the GPU cannot hold, a compile error: go on
            print(f"{head} FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
            if on_gpu and not _cuda_alive():  # a sticky error: every later launch would fail
                print("CUDA context lost: the rest of this sweep cannot run")
                break
            continue
        max_abs = float((out - expected).abs().max())
        rel = float((out - expected).norm() / expected.norm())
        ok = bool(torch.isfinite(out).all()) and rel <= MAX_REL_ERROR
        bw = moved / (ms * 1e-3)
        print(f"{head} {ms * 1e3:8.1f} {bw / 1e12:6.2f} {bw / copy_bw:5.0%} {max_abs:8.1e} "
              f"{rel:8.1e}{'' if ok else '  WRONG'}")  # fmt: skip
        if ok:
            good.append((bw, config))
    good.sort(key=lambda row: -row[0])
    return good


def _cuda_alive() -> bool:
    try:
        torch.cuda.synchronize()
    except Exception:  # an illegal memory access and the like poison the context
        return False
    return True


def _median_ms(fn: Callable[[], torch.Tensor]) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def sweep_variants(copy_bw: float) -> None:
    t0 = time.monotonic()
    unique = list(dict.fromkeys(CONFIGS))
    best: list[tuple[str, Row]] = []
    deadline = t0 + TIME_BUDGET_S
    main = sweep_shape(256, 1024, unique, copy_bw, deadline=t0 + 0.75 * TIME_BUDGET_S)
    if main:
        best.append(("256x1024", main[0]))
    # at 32 rows the split count matters most: the winner again at 4, 8 and 16 splits
    pps = [dataclasses.replace(main[0][1], programs_per_sm=n) for n in (1, 2, 4)] if main else []
    long_configs = list(dict.fromkeys([DEFAULT_CONFIG] + [c for _, c in main[:3]] + pps))
    long = sweep_shape(32, 4096, long_configs, copy_bw, deadline=deadline) if _cuda_alive() else []
    if long:
        best.append(("32x4096", long[0]))
    print(f"\nsweep took {time.monotonic() - t0:.0f} s")
    for shape, (bw, config) in best:
        print(f"BEST {_short(config)} {bw / 1e12:.2f} TB/s "
              f"{bw / copy_bw:.0%} of copy at {shape}: DEFAULT_CONFIG = {config_expr(config)}")  # fmt: skip
