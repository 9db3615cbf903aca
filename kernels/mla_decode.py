"""Triton multi-head latent attention over the paged latent cache, absorbed form, one pass.

Every query row t (a decode token, or a prefill token attending causally) attends to the first
ctx[t] tokens of sequence seq[t]. The query comes in already absorbed into the latent space
(gpu/mla_layer.py: q_lat,h = W_uk,h^T q_nope,h), so all heads score against the same cached
row [c | k_r] and a program reads each latent row once for BLOCK_H heads:

    cache [blocks, block_size, 1, L + R]           slot = block * block_size + offset
    score[h, n] = (q_lat[h] . c[n] + q_rope[h] . k_r[n]) * scale
    o_lat[h]    = softmax(score[h]) @ c             [T, H, L]; the caller applies W_uv

Pass 1, grid (row, head block, split): a split streams its slice of the context in BLOCK_N
tiles with an online softmax (base 2). One split writes o_lat directly; more write partial
outputs and log-sum-exps, merged by pass 2, grid (row, head). Splits cut the context by the
row's own ctx (read from the device), the grid depends on shapes only: no host sync, so a CUDA
graph captures it.

Variants (MlaLaunch.variant; DEFAULT_CONFIG is the one the engine runs, ops/mla_bench.py
--sweep-variants times them all):
    HEADS_M   this file's pass 1: heads are the M side ([BLOCK_H x 576] @ [576 x BLOCK_N])
    TOKENS_M  kernels/mla_decode_tokens.py: the products transposed, the BLOCK_N tokens are M
              (wgmma-sized with BLOCK_N >= 64 on Hopper)
    PAGED     kernels/mla_decode_paged.py: heads as rows, one block id per page, with
              MlaLaunch.ids_ahead / q_reload / col_parts (the ids a tile early, q not held in
              registers, the 512 output columns split between two programs)
    TMA       kernels/mla_decode_tma.py: heads as rows, one page per step loaded by TMA
              (tensor descriptors; block_n unused), ids_ahead as PAGED's
MlaLaunch.half_partials keeps the split partial outputs in the output dtype (half the merge
traffic of fp32 partials); MlaLaunch.fused_merge has the last split of a row merge the
partials inside pass 1 (kernels/mla_split_merge.py: one launch instead of two); MlaLaunch.prefetch double-buffers
the latent tiles in registers by hand (kernels/mla_tile.py).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import dataclasses
import enum

import torch
import triton
import triton.language as tl

from .mla_decode_paged import mla_split_paged_kernel
from .mla_decode_tma import latent_pieces, mla_split_tma_kernel, tma_descriptors
from .mla_decode_tokens import mla_split_tokens_kernel
from .mla_split_merge import arrival_counters, merge_if_last
from .mla_tile import load_latent_tile

_LOG2E = 1.4426950408889634


class MlaVariant(enum.Enum):
    """Pass-1 algorithm (see the module docstring)."""

    HEADS_M = "heads_m"
    TOKENS_M = "tokens_m"
    PAGED = "paged"
    TMA = "tma"


@dataclasses.dataclass(frozen=True)
class MlaLaunch:
    """Algorithm and launch parameters; ops/mla_bench.py sweeps them."""

    variant: MlaVariant = MlaVariant.HEADS_M
    block_h: int = 16
    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 2
    half_partials: bool = False  # split partials in the output dtype instead of fp32
    fused_merge: bool = False  # the last split of a row merges (kernels/mla_split_merge.py)
    programs_per_sm: int = 4  # the split count aims at this many programs per SM
    prefetch: bool = False  # load the next tile before using this one (kernels/mla_tile.py)
    max_registers: int | None = None  # Triton's maxnreg: cap registers/thread for more programs
    ids_ahead: bool = False  # PAGED, TMA: the next tile's block ids loaded an iteration early
    # PAGED only (kernels/mla_decode_paged.py):
    q_reload: bool = False  # q_lat loaded in the loop, not held in registers
    col_parts: int = 1  # 2: two programs per row, each accumulating half the latent columns

    def column_programs(self) -> int:
        """Programs per (row, head block, split): col_parts for PAGED, else 1."""
        return self.col_parts if self.variant is MlaVariant.PAGED else 1


# The launch the engine runs (kernels/mla_ops.py): set it to the BEST line of
# `python3 -m troupe.ops.mla_bench --sweep-variants` (H200 2026-12-02 16:23, 256 x 1,024: this
# one 90.7 us, 81% of copy; PAGED bn 32 st 3 pps 4 102.1 us, 72%; HEADS_M 114.5 us, 64%).
DEFAULT_CONFIG = MlaLaunch(
    variant=MlaVariant.PAGED,
    block_n=64,
    num_warps=4,
    num_stages=2,
    programs_per_sm=3,
    half_partials=True,
    fused_merge=True,
    ids_ahead=True,
)


@triton.jit
def _mla_split_kernel(
    q_lat_ptr,  # [T, H, L]
    q_rope_ptr,  # [T, H, R]
    cache_ptr,  # [slots, L + R]
    out_ptr,  # [T, H, L] when NUM_SPLITS == 1
    part_out_ptr,  # [T, H, NUM_SPLITS, L] fp32 otherwise
    part_lse_ptr,  # [T, H, NUM_SPLITS] fp32
    block_tables_ptr,
    row_seq_ptr,  # [T] int32: the sequence of each row
    row_ctx_ptr,  # [T] int32: tokens the row sees (0: padding row)
    counter_ptr,  # [T * head blocks] int32 arrival counters (FUSED_MERGE), zero between launches
    qk_scale,  # softmax scale * log2(e)
    stride_qt,
    stride_qh,
    stride_rt,
    stride_rh,
    stride_ot,
    stride_oh,
    stride_bt,
    NUM_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    LATENT: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr,
    FUSED_MERGE: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(row_seq_ptr + row).to(tl.int64)
    ctx = tl.load(row_ctx_ptr + row)
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < NUM_HEADS
    offs_l = tl.arange(0, BLOCK_L)
    offs_r = tl.arange(0, BLOCK_R)
    l_mask = offs_l < LATENT
    r_mask = offs_r < ROPE
    q_rows = row * stride_qt + heads[:, None].to(tl.int64) * stride_qh
    q = tl.load(q_lat_ptr + q_rows + offs_l[None, :], mask=h_mask[:, None] & l_mask[None, :])
    r_rows = row * stride_rt + heads[:, None].to(tl.int64) * stride_rh
    qr = tl.load(q_rope_ptr + r_rows + offs_r[None, :], mask=h_mask[:, None] & r_mask[None, :])
    chunk = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, ctx)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_L], tl.float32)
    table_row = block_tables_ptr + seq * stride_bt
    if PREFETCH:
        c_next, kr_next = load_latent_tile(cache_ptr, table_row, start, end, offs_l, offs_r,
                                           l_mask, r_mask, BLOCK_SIZE, LATENT, ROPE, BLOCK_N)  # fmt: skip
    for n0 in range(start, end, BLOCK_N):
        if PREFETCH:
            c, kr = c_next, kr_next
            c_next, kr_next = load_latent_tile(cache_ptr, table_row, n0 + BLOCK_N, end, offs_l,
                                               offs_r, l_mask, r_mask, BLOCK_SIZE, LATENT, ROPE,
                                               BLOCK_N)  # fmt: skip
        else:
            c, kr = load_latent_tile(cache_ptr, table_row, n0, end, offs_l, offs_r, l_mask,
                                     r_mask, BLOCK_SIZE, LATENT, ROPE, BLOCK_N)  # fmt: skip
        p_mask = n0 + tl.arange(0, BLOCK_N) < end
        s = tl.dot(q, tl.trans(c), input_precision=PRECISION)
        s += tl.dot(qr, tl.trans(kr), input_precision=PRECISION)
        s = tl.where(p_mask[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision=PRECISION)
        m = m_new
    has = denom > 0
    o = acc / tl.where(has, denom, 1.0)[:, None]
    o_mask = h_mask[:, None] & l_mask[None, :]
    if NUM_SPLITS == 1:
        dst = out_ptr + row * stride_ot + heads[:, None].to(tl.int64) * stride_oh + offs_l[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        part = (row * NUM_HEADS + heads.to(tl.int64)) * NUM_SPLITS + split
        dst = part_out_ptr + part[:, None] * LATENT + offs_l[None, :]
        tl.store(dst, o.to(part_out_ptr.dtype.element_ty), mask=o_mask)
        lse = tl.where(has, m + tl.math.log2(tl.where(has, denom, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=h_mask)
        if FUSED_MERGE:
            counter = counter_ptr + row * tl.num_programs(1) + head_block
            merge_if_last(counter, part_out_ptr, part_lse_ptr, out_ptr, row, heads, h_mask,
                          stride_ot, stride_oh, NUM_HEADS, LATENT, BLOCK_H, BLOCK_L, NUM_SPLITS)  # fmt: skip


@triton.jit
def _mla_merge_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    LATENT: tl.constexpr,
    BLOCK_L: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    splits = tl.arange(0, BLOCK_S)
    s_mask = splits < NUM_SPLITS
    base = (row * NUM_HEADS + head) * NUM_SPLITS
    lse = tl.load(part_lse_ptr + base + splits, mask=s_mask, other=float("-inf"))
    top = tl.max(lse, axis=0)
    w = tl.where(
        lse > float("-inf"), tl.math.exp2(lse - tl.where(top > float("-inf"), top, 0.0)), 0.0
    )
    total = tl.sum(w, axis=0)
    offs_l = tl.arange(0, BLOCK_L)
    l_mask = offs_l < LATENT
    parts = tl.load(
        part_out_ptr + (base + splits)[:, None] * LATENT + offs_l[None, :],
        mask=s_mask[:, None] & l_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    o = tl.sum(parts * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + row * stride_ot + head * stride_oh + offs_l,
        o.to(out_ptr.dtype.element_ty),
        mask=l_mask,
    )


SPLIT_KERNELS = {
    MlaVariant.HEADS_M: _mla_split_kernel,
    MlaVariant.TOKENS_M: mla_split_tokens_kernel,
    MlaVariant.PAGED: mla_split_paged_kernel,
}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # interpreter: a few splits so the tests exercise the merge
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def choose_num_splits(
    num_rows: int, num_head_blocks: int, max_context: int, num_sms: int, programs_per_sm: int = 4
) -> int:
    """Splits so that about programs_per_sm programs run per SM, each over >= 128 tokens of the
    longest context the table can hold (shapes only: a CUDA graph replays the same launch)."""
    programs = num_rows * num_head_blocks
    wanted = max(1, (programs_per_sm * num_sms) // max(programs, 1))
    return max(1, min(wanted, max_context // 128, 16))


def _register_cap(config: MlaLaunch) -> dict[str, int]:
    return {} if config.max_registers is None else {"maxnreg": config.max_registers}


def _paged_constexprs(config: MlaLaunch, latent: int, block_l: int) -> dict[str, object]:
    """The PAGED kernel's own constexprs ({} for the other variants)."""
    if config.variant is not MlaVariant.PAGED:
        return {}
    if config.col_parts not in (1, 2) or (config.col_parts == 2 and latent != block_l):
        raise ValueError(f"MlaLaunch.col_parts {config.col_parts}: 1, or 2 with a power-of-two "
                         f"latent width (got {latent})")  # fmt: skip
    return {"IDS_AHEAD": config.ids_ahead, "Q_RELOAD": config.q_reload,
            "COL_PARTS": config.col_parts}  # fmt: skip


def mla_attention_triton(
    q_lat: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    row_seq: torch.Tensor,
    row_ctx: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    config: MlaLaunch = DEFAULT_CONFIG,
) -> torch.Tensor:
    """o_lat [T, H, L] in q_lat's dtype for q_lat [T, H, L], q_rope [T, H, R] over cache
    [blocks, block_size, 1, L + R]; row t sees the first row_ctx[t] tokens of sequence
    row_seq[t] (both int32 [T] on the device; ctx 0 gives zeros)."""
    num_rows, num_heads, latent = q_lat.shape
    rope = q_rope.shape[2]
    block_size = cache.shape[1]
    assert cache.shape[-1] == latent + rope, f"cache rows {cache.shape[-1]} != {latent} + {rope}"
    assert cache.is_contiguous(), "the latent cache must be contiguous"
    assert q_lat.stride(2) == 1 and q_rope.stride(2) == 1, "head rows must be contiguous"
    out = torch.empty(num_rows, num_heads, latent, dtype=q_lat.dtype, device=q_lat.device)
    if num_rows == 0:
        return out
    block_h = max(16, min(config.block_h, triton.next_power_of_2(num_heads)))
    head_blocks = triton.cdiv(num_heads, block_h)
    if num_splits is None:
        max_context = block_tables.shape[1] * block_size
        num_splits = choose_num_splits(
            num_rows, head_blocks * config.column_programs(), max_context,
            _num_sms(q_lat.device), config.programs_per_sm,
        )  # fmt: skip
    part_out = part_lse = out  # unused with one split
    if num_splits > 1:
        part_dtype = q_lat.dtype if config.half_partials else torch.float32
        part_out = torch.empty(
            num_rows, num_heads, num_splits, latent, dtype=part_dtype, device=q_lat.device
        )
        part_lse = torch.empty(
            num_rows, num_heads, num_splits, dtype=torch.float32, device=q_lat.device
        )
    block_l = max(16, triton.next_power_of_2(latent))
    paged = _paged_constexprs(config, latent, block_l)
    parts = config.column_programs()
    fused = config.fused_merge and num_splits > 1 and parts == 1
    counters = arrival_counters(num_rows * head_blocks, q_lat.device) if fused else row_ctx
    block_r = max(16, triton.next_power_of_2(rope))
    precision = "ieee" if q_lat.dtype == torch.float32 else "tf32"
    if config.variant is MlaVariant.TMA:
        piece = latent_pieces(latent)
        c_desc, r_desc = tma_descriptors(cache, piece, block_r)
        mla_split_tma_kernel[(num_rows, head_blocks, num_splits)](
            q_lat, q_rope, c_desc, r_desc, cache, out, part_out, part_lse, block_tables, row_seq,
            row_ctx, counters, scale * _LOG2E,
            q_lat.stride(0), q_lat.stride(1), q_rope.stride(0), q_rope.stride(1),
            out.stride(0), out.stride(1), block_tables.stride(0),
            NUM_HEADS=num_heads, BLOCK_SIZE=block_size, LATENT=latent, ROPE=rope, BLOCK_H=block_h,
            PIECE=piece, BLOCK_R=block_r, NUM_SPLITS=num_splits, PRECISION=precision,
            FUSED_MERGE=fused, IDS_AHEAD=config.ids_ahead, **_register_cap(config),
            num_warps=config.num_warps, num_stages=config.num_stages,
        )  # fmt: skip
    else:
        split_kernel = SPLIT_KERNELS[config.variant]
        split_kernel[(num_rows * parts, head_blocks, num_splits)](
            q_lat, q_rope, cache, out, part_out, part_lse, block_tables, row_seq, row_ctx,
            counters, scale * _LOG2E,
            q_lat.stride(0), q_lat.stride(1), q_rope.stride(0), q_rope.stride(1),
            out.stride(0), out.stride(1), block_tables.stride(0),
            NUM_HEADS=num_heads, BLOCK_SIZE=block_size, LATENT=latent, ROPE=rope,
            BLOCK_H=block_h, BLOCK_L=block_l, BLOCK_R=block_r, BLOCK_N=config.block_n,
            NUM_SPLITS=num_splits, PRECISION=precision, FUSED_MERGE=fused,
            PREFETCH=config.prefetch, **paged, **_register_cap(config),
            num_warps=config.num_warps, num_stages=config.num_stages,
        )  # fmt: skip
    if num_splits > 1 and not fused:
        _mla_merge_kernel[(num_rows, num_heads)](
            part_out, part_lse, out, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, LATENT=latent, BLOCK_L=block_l, NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits),
        )  # fmt: skip
    return out
