"""The MLA decode kernel's variants x launch configs at DeepSeek-V2-Lite shape (GPU), one table.

    python3 -m troupe.ops.mla_bench --sweep-variants

Every kernels/mla_decode.MlaLaunch below runs at 256 sequences x 1,024 tokens; today's default,
the best two and the best at 4 / 8 / 16 splits run again at 32 x 4,096. Each row: the split count the config picks, the
median kernel time, the rate over the bytes the kernel must move (latent cache rows once, q_lat,
q_rope, o_lat: ops/mla_bench.py's count) against copy bandwidth, and the error of o_lat against
a torch fp32 softmax over the same gathered latent rows, computed on the GPU for every row
(max abs and relative norm; rel > 2e-2 or a non-finite value marks the row WRONG). A config
that fails (out of shared memory, a compile error) prints its exception and the sweep goes on.
The last lines, `BEST <variant> <config> <figure>` per shape, name the fastest correct row and
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
    MlaVariant,
    choose_num_splits,
    mla_attention_triton,
)

HEADS, LORA, ROPE, NOPE, BLOCK_SIZE = 16, 512, 64, 128, 16
MAX_REL_ERROR = 2e-2
TIME_BUDGET_S = 75.0  # the sweep's share of the lead's combined H200 call: later configs skip
H, T, P = MlaVariant.HEADS_M, MlaVariant.TOKENS_M, MlaVariant.PAGED


def _c(
    variant: MlaVariant, bn: int, warps: int, stages: int, pps: int, fast: bool, prefetch: bool
) -> MlaLaunch:
    """fast: bf16 partials merged inside pass 1 (half_partials + fused_merge)."""
    return MlaLaunch(variant=variant, block_n=bn, num_warps=warps, num_stages=stages,
                     programs_per_sm=pps, half_partials=fast, fused_merge=fast, prefetch=prefetch)  # fmt: skip


def _p(
    bn: int,
    warps: int,
    stages: int,
    pps: int,
    ahead: bool,
    reload: bool,
    parts: int = 1,
    regs: int | None = None,
) -> MlaLaunch:
    """PAGED (kernels/mla_decode_paged.py), bf16 partials, merged in pass 1 when parts == 1."""
    return MlaLaunch(variant=P, block_n=bn, num_warps=warps, num_stages=stages,
                     programs_per_sm=pps, half_partials=True, fused_merge=parts == 1,
                     ids_ahead=ahead, q_reload=reload, col_parts=parts, max_registers=regs)  # fmt: skip


def _t(stages: int, pps: int, regs: int | None = None) -> MlaLaunch:
    """TMA (kernels/mla_decode_tma.py): a page a step, ids ahead, bf16 partials merged in pass 1."""
    return MlaLaunch(variant=MlaVariant.TMA, num_stages=stages, programs_per_sm=pps,
                     half_partials=True, fused_merge=True, ids_ahead=True, max_registers=regs)  # fmt: skip


# programs_per_sm on 132 SMs at 256 rows: 2 -> 1 split, 4 -> 2, 8 -> 4 (col_parts 2 counts
# twice). Compiled for sm_90 by triton 3.7 (`python3 -m troupe.ops.mla_compile_check`, no GPU):
# today's HEADS_M bn 32 w4 takes 206 registers (2 programs per SM; ncu on the H200: 208) and ONE
# shared buffer for the latent tile at num_stages 2. PAGED (one id per page, the rolled fused
# merge) takes 127-128 at bn 32 st2 and bn 16 st3 at 2-8 splits: 4 programs per SM (56 KB of
# shared memory each); bn 16 st3 gets two tile buffers (load and compute overlap), st4 three
# (74 KB: 3 per SM); bn 16 st2 capped at 96 registers (56-byte spill) 5 per SM; bn 32 st3 two
# buffers at 93 KB (2 per SM); col_parts 2: bn 16 st3 128 (4 per SM), bn 32 158 (3; capped at
# 128: 48-byte spill, 4); ids not ahead 183 (capped at 128: no spill). TMA: one 18 KB stage
# per page (st3 56 KB, st4 74 KB), 205 registers (2 per SM; capped at 168: 24-byte spill, 3;
# at 128: 168-byte spill, 4). PAGED and TMA first (this session's variants), then the best of
# the earlier ones (docs/benchmarks.md, 2026-12-02: HEADS_M fused 64%, TOKENS_M 56%, prefetch
# <= 54%).
CONFIGS = [
    DEFAULT_CONFIG,
    _p(32, 4, 2, 4, True, False),
    _p(16, 4, 3, 8, True, False),
    _p(16, 4, 3, 4, True, False),
    _p(32, 4, 2, 8, True, False),
    _t(3, 4),
    _t(3, 4, regs=128),
    _p(32, 4, 2, 4, False, False, regs=128),  # ids not ahead (idea 1 alone)
    _p(16, 4, 4, 8, True, False),
    _p(16, 4, 2, 8, True, False, regs=96),
    _t(4, 8, regs=168),
    _p(16, 4, 3, 8, True, False, 2),
    _p(32, 4, 2, 8, True, False, 2, regs=128),
    _p(32, 4, 3, 4, True, False),
    _p(32, 4, 2, 4, True, True),
    _p(32, 8, 2, 4, True, False),
    _p(32, 4, 2, 16, True, False),
    _t(2, 4),
    # today's kernel capped at 128 registers (112-byte spill, 4 per SM): registers alone?
    dataclasses.replace(_c(H, 32, 4, 2, 4, True, False), max_registers=128),
    MlaLaunch(),
    _c(H, 32, 4, 2, 4, True, False),
    _c(T, 64, 4, 3, 4, True, False),
    # TOKENS_M with the register prefetch hit an illegal memory access on the H200 (2026-12-02,
    # docs/benchmarks.md): last, since a CUDA error ends every launch after it in the process
    _c(T, 64, 8, 1, 2, False, True),
]


def config_expr(config: MlaLaunch) -> str:
    """The MlaLaunch(...) expression for the fields that differ from the dataclass default."""
    base = MlaLaunch()
    fields = [
        f"{f.name}={getattr(config, f.name)!s}"  # an enum prints as MlaVariant.NAME
        for f in dataclasses.fields(MlaLaunch)
        if getattr(config, f.name) != getattr(base, f.name)
    ]
    return f"MlaLaunch({', '.join(fields)})"


def _short(config: MlaLaunch) -> str:
    extra = (" half" if config.half_partials else "") + (" fused" if config.fused_merge else "")
    extra += " prefetch" if config.prefetch else ""
    extra += " ahead" if config.ids_ahead else ""
    extra += " reload" if config.q_reload else ""
    extra += f" parts={config.col_parts}" if config.col_parts != 1 else ""
    extra += f" regs={config.max_registers}" if config.max_registers else ""
    bn = "page" if config.variant is MlaVariant.TMA else config.block_n  # TMA: a page a step
    return (f"bn={bn} w={config.num_warps} st={config.num_stages} "
            f"pps={config.programs_per_sm}{extra}")  # fmt: skip


def _problem(num_seqs: int, context: int, device: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(num_seqs + context)
    per_seq = -(-context // BLOCK_SIZE)
    num_blocks = num_seqs * per_seq
    order = torch.randperm(num_blocks, generator=gen, device=device)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * scale).bfloat16()

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
) -> list[Row]:
    """Print one table row per config; return (bandwidth, config) of the correct ones (sorted,
    fastest first). device/timer: a CPU smoke run of the table under TRITON_INTERPRET=1."""
    p = _problem(num_seqs, context, device)
    scale = (NOPE + ROPE) ** -0.5
    expected = _reference(p, scale)
    on_gpu = device == "cuda"
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count if on_gpu else 4
    moved = (p["cache"].numel() + 2 * p["q_lat"].numel() + p["q_rope"].numel()) * 2
    print(f"\n{num_seqs} x {context}: {moved / 1e6:.0f} MB to move")
    print(f"{'variant':<9} {'config':<56} {'splits':>6} {'us':>8} {'TB/s':>6} {'copy':>5} "
          f"{'max abs':>8} {'rel':>8}")  # fmt: skip
    good: list[Row] = []
    for config in configs:
        splits = choose_num_splits(num_seqs, config.column_programs(), context, num_sms,
                                   config.programs_per_sm)  # fmt: skip

        def kernel(config: MlaLaunch = config) -> torch.Tensor:
            return mla_attention_triton(p["q_lat"], p["q_rope"], p["cache"], p["table"], p["seq"],
                                        p["ctx"], scale, config=config)  # fmt: skip

        head = f"{config.variant.value:<9} {_short(config):<56} {splits:>6}"
        if time.monotonic() > deadline:
            print(f"{head} skipped (past the sweep's {TIME_BUDGET_S:.0f} s)")
            continue
        try:
            out = kernel().float()
            ms = (timer or _median_ms)(kernel)
        except Exception as exc:  # a tile the GPU cannot hold, a compile error: go on
            print(f"{head} FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
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
    pps = [dataclasses.replace(main[0][1], programs_per_sm=n, half_partials=True,
                               fused_merge=True) for n in (1, 2, 4)] if main else []  # fmt: skip
    long_configs = list(dict.fromkeys([DEFAULT_CONFIG] + [c for _, c in main[:2]] + pps))
    long = sweep_shape(32, 4096, long_configs, copy_bw, deadline=deadline)
    if long:
        best.append(("32x4096", long[0]))
    print(f"\nsweep took {time.monotonic() - t0:.0f} s")
    for shape, (bw, config) in best:
        print(f"BEST {config.variant.value} {_short(config)} {bw / 1e12:.2f} TB/s "
              f"{bw / copy_bw:.0%} of copy at {shape}: DEFAULT_CONFIG = {config_expr(config)}")  # fmt: skip
