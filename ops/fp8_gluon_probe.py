"""Pass 1 of paged decode attention over an fp8 cache in Gluon: a probe (issue 12).

    python -m troupe.ops.fp8_gluon_probe compile [64/3/4/1 ...]  # no GPU: the sm_90 builds
    python -m troupe.ops.fp8_gluon_probe           # GPU: against the engine's Triton kernel
    python -m troupe.ops.fp8_gluon_probe --l2      # the same over a KV pool that stays in L2

The engine's Triton kernel (kernels/decode_attention_fp8.py) stays near 74% of copy on the
H200. Either its V operand is read from shared memory one byte at a time (AT_DOT: Triton has no
8-bit transposed ldmatrix) or, converted where loaded (V_AT_LOAD), its loads lose the cp.async
pipeline. Gluon (Triton's explicit-layout dialect, in 3.6 and 3.7) expresses both fixes at
once: the fp8 tiles stream by cp.async into a ring of STAGES shared buffers, each tile is read
back in 16-byte rows, converted to fp16 in registers (F2FP.F16.E4M3.UNPACK_B, two values an
instruction), stored to an fp16 buffer and read from it in the mma operand layouts (ldmatrix;
.trans for V): no byte-wise shared loads. q is padded to 16 rows (mma_v2's m16), the scores and
P.V run as mma.sync, and each split writes fp32 partials and their log-sum-exp as the Triton
kernel's pass 1 does (the probe merges them in torch against kernels/reference).

Measured (docs/benchmarks.md, session 43, H100): correct (errors as the Triton kernel's); four
warps a program 50-70% of copy, one warp a program (its score reductions stay in the warp) up
to 83-88% on many sequences, against the Triton kernel's 87-95% in the same runs; at sm_90
0.082-0.123 warp instructions a KV byte (the Triton kernel 0.125), no byte-wise shared loads.
Not adopted; the H200 (where the Triton kernel is at 74%) has not run it.
"""

# Gluon kernels take untyped pointers and constexprs; @gluon.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from troupe.kernels.paged_batch import PagedBatch
from troupe.ops.h200_standin import folded_tables

# triton 3.6 names the CTA barrier thread_barrier, 3.7 barrier
_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier


@gluon.jit
def _tile_ptrs(
    cache_ptr,
    bt_row,
    n0,
    end,
    kv_head,
    stride_slot,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_SIZE: gl.constexpr,
    layout: gl.constexpr,
):
    t = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    ok = t < end
    page = gl.load(bt_row + t // BLOCK_SIZE, mask=ok, other=0).to(gl.int64)
    row = (page * BLOCK_SIZE + t % BLOCK_SIZE) * stride_slot + kv_head * HEAD_DIM
    return cache_ptr + row[:, None] + d[None, :], ok[:, None] & (d[None, :] < HEAD_DIM)


@gluon.jit
def _issue(k_ptr, v_ptr, k_slot, v_slot, bt_row, n0, end, kv_head, stride_slot,
           BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_SIZE: gl.constexpr,
           layout: gl.constexpr):  # fmt: skip
    """cp.async of the K and V tile at token n0 into their ring slots, as one commit group."""
    kp, ok = _tile_ptrs(k_ptr, bt_row, n0, end, kv_head, stride_slot, BLOCK_N, HEAD_DIM,
                        BLOCK_SIZE, layout)  # fmt: skip
    async_copy.async_copy_global_to_shared(k_slot, kp, mask=ok)
    vp, ok = _tile_ptrs(v_ptr, bt_row, n0, end, kv_head, stride_slot, BLOCK_N, HEAD_DIM,
                        BLOCK_SIZE, layout)  # fmt: skip
    async_copy.async_copy_global_to_shared(v_slot, vp, mask=ok)
    async_copy.commit_group()


@gluon.jit
def fp8_decode_gluon_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    part_out_ptr,
    part_lse_ptr,
    bt_ptr,
    seq_lens_ptr,
    k_scale_ptr,
    v_scale_ptr,
    qk_scale,
    stride_qs,
    stride_qh,
    stride_bt,
    stride_slot,
    NUM_Q_HEADS: gl.constexpr,
    GROUP: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_SIZE: gl.constexpr,
    NUM_SPLITS: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    NUM_WARPS: gl.constexpr,
    F16_BUFS: gl.constexpr,  # 2: the fp16 operand buffers alternate (one barrier a tile)
    K_DIRECT: gl.constexpr,  # K's operand loaded from the fp8 ring (no fp16 buffer for K)
):
    BLOCK_G: gl.constexpr = 16
    load_l: gl.constexpr = gl.BlockedLayout(
        [1, 16], [32 // (HEAD_DIM // 16), HEAD_DIM // 16], [NUM_WARPS, 1], [1, 0]
    )
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[1, NUM_WARPS], instr_shape=[16, 8]
    )
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    ring_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    f16_l: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])

    kv_head = gl.program_id(0)
    seq = gl.program_id(1)
    split = gl.program_id(2)
    qk_scale = qk_scale * gl.load(k_scale_ptr + kv_head)
    v_scale = gl.load(v_scale_ptr + kv_head)
    seq_len = gl.load(seq_lens_ptr + seq).to(gl.int32)
    chunk = gl.cdiv(gl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = gl.minimum(start + chunk, seq_len)
    n_tiles = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)

    # q [16, D]: GROUP real rows, fp16 (clamped to its range)
    g = gl.arange(0, BLOCK_G, layout=gl.SliceLayout(1, load_l))
    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, load_l))
    heads = kv_head * GROUP + g
    q = gl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :],
        mask=(g < GROUP)[:, None] & (d < HEAD_DIM)[None, :],
        other=0.0,
    )
    q = gl.minimum(gl.maximum(q.to(gl.float32), -65504.0), 65504.0).to(gl.float16)
    b4: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
    a4: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    q4 = gl.convert_layout(q, a4)  # K_DIRECT: fp16 operands of k_width 4, as the fp8 ones
    q2 = gl.convert_layout(q, a_l)

    k_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, HEAD_DIM], ring_l)
    v_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, HEAD_DIM], ring_l)
    if not K_DIRECT:
        k16s = gl.allocate_shared_memory(gl.float16, [F16_BUFS, BLOCK_N, HEAD_DIM], f16_l)
    v16s = gl.allocate_shared_memory(gl.float16, [F16_BUFS, BLOCK_N, HEAD_DIM], f16_l)
    bt_row = bt_ptr + seq * stride_bt

    for i in gl.static_range(STAGES - 1):  # the prologue: the first STAGES - 1 tiles
        _issue(k_ptr, v_ptr, k_ring.index(i), v_ring.index(i), bt_row, start + i * BLOCK_N, end,
               kv_head, stride_slot, BLOCK_N, HEAD_DIM, BLOCK_SIZE, load_l)  # fmt: skip

    m_i = gl.full([BLOCK_G], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma))
    l_i = gl.zeros([BLOCK_G], gl.float32, layout=gl.SliceLayout(1, mma))
    acc = gl.zeros([BLOCK_G, HEAD_DIM], gl.float32, layout=mma)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    for it in range(0, n_tiles):
        ahead = it + STAGES - 1  # issue the tile STAGES - 1 ahead (past the end: masked off)
        slot = ahead % STAGES
        _issue(k_ptr, v_ptr, k_ring.index(slot), v_ring.index(slot), bt_row,
               start + ahead * BLOCK_N, end, kv_head, stride_slot, BLOCK_N, HEAD_DIM, BLOCK_SIZE,
               load_l)  # fmt: skip
        # tile `it` has landed: each thread reads back the bytes it copied, so no barrier
        async_copy.wait_group(STAGES - 1)
        cur = it % STAGES
        v16 = v16s.index(it % F16_BUFS)
        v16.store(v_ring.index(cur).load(load_l).to(gl.float16))
        if not K_DIRECT:
            k16 = k16s.index(it % F16_BUFS)
            k16.store(k_ring.index(cur).load(load_l).to(gl.float16))
        _barrier()
        zero = gl.zeros([BLOCK_G, BLOCK_N], gl.float32, layout=mma)
        if K_DIRECT:  # K^T's pairs along D are adjacent bytes: its operand straight from the ring
            qk = mma_v2(q4, k_ring.index(cur).permute((1, 0)).load(b4).to(gl.float16), zero)
        else:
            qk = mma_v2(q2, k16.permute((1, 0)).load(b_l), zero)
        qk = qk * qk_scale
        n = start + it * BLOCK_N + cols
        qk = gl.where((n < end)[None, :], qk, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(qk, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        vv = v16.load(b_l)
        acc = mma_v2(gl.convert_layout(p.to(gl.float16), a_l), vv, acc * alpha[:, None])
        if F16_BUFS == 1:  # the fp16 buffers are read before the next tile overwrites them
            _barrier()
    async_copy.wait_group(0)

    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    o = acc * (v_scale / l_safe)[:, None]
    go = gl.arange(0, BLOCK_G, layout=gl.SliceLayout(1, mma))
    do = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, mma))
    row = (seq * NUM_Q_HEADS + kv_head * GROUP + go) * NUM_SPLITS + split
    gl.store(
        part_out_ptr + row[:, None] * HEAD_DIM + do[None, :],
        o,
        mask=(go < GROUP)[:, None] & (do < HEAD_DIM)[None, :],
    )
    gl.store(part_lse_ptr + row, m_i + gl.log2(l_safe), mask=go < GROUP)


def constexprs(
    num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int, num_splits: int,
    launch: tuple[int, int, int, int, int],
) -> dict[str, object]:  # fmt: skip
    block_n, stages, warps, bufs, k_direct = launch
    return {
        "NUM_Q_HEADS": num_q_heads, "GROUP": num_q_heads // num_kv_heads, "HEAD_DIM": head_dim,
        "BLOCK_SIZE": block_size, "NUM_SPLITS": num_splits, "BLOCK_N": block_n,
        "STAGES": stages, "NUM_WARPS": warps, "F16_BUFS": bufs, "K_DIRECT": bool(k_direct),
    }  # fmt: skip


def parse(name: str) -> tuple[int, int, int, int, int]:
    """A launch's fields ("gluon 16/4/1/1/1"): block_n, stages, warps, fp16 buffers and
    K_DIRECT, the last two 1 and 0 where not given (the Triton launch gives three)."""
    fields = [int(x) for x in name.split()[1].split("/")]
    fields += [1, 0][len(fields) - 3 :]
    return fields[0], fields[1], fields[2], fields[3], fields[4]


def compile_only(names: list[str]) -> None:
    """The probe's launches (those named, as "64/3/4/1", else all) built for sm_90: registers,
    shared memory, the main loop's SASS."""
    from troupe.ops.fp8_compile_check import loop_body
    from troupe.ops.sm90_compile import compile_sm90

    types = {"k_ptr": "*fp8e4nv", "v_ptr": "*fp8e4nv", "part_out_ptr": "*fp32",
             "part_lse_ptr": "*fp32", "bt_ptr": "*i32", "seq_lens_ptr": "*i32",
             "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32", "qk_scale": "fp32"}  # fmt: skip
    for name in LAUNCHES[1:]:
        if names and name.split()[1] not in names:
            continue
        launch = parse(name)
        block_n, _, warps, _, _ = launch
        consts = constexprs(32, 8, 128, 16, 8, launch)
        build = compile_sm90(fp8_decode_gluon_kernel, consts, types, warps, 1, sass=True)
        ops = loop_body(build.sass)
        counts = {k: sum(1 for o in ops if o.startswith(k))
                  for k in ("LDS", "LDS.U8", "LDSM", "STS", "LDGSTS", "HMMA", "F2FP", "BAR")}  # fmt: skip
        per_byte = len(ops) * warps / (2 * block_n * 128)
        print(f"{name}: {build.regs} registers, {build.smem} bytes of shared memory; loop "
              f"{len(ops)} instructions, {per_byte:.3f} warp instructions a KV byte; {counts}",
              flush=True)  # fmt: skip


LAUNCHES = (
    "triton 128/3/2", "gluon 64/3/4/1", "gluon 32/4/4/2", "gluon 16/4/1/1", "gluon 32/4/1/1",
    "gluon 16/4/1/1/1", "gluon 32/4/1/1/1", "gluon 16/6/1/1/1",
)  # fmt: skip  # block_n / stages / warps[ / fp16 buffers / K_DIRECT]; triton: the engine's


def launcher(
    name: str, batch: PagedBatch, k8: torch.Tensor, v8: torch.Tensor, scales: torch.Tensor,
    splits: int, po: torch.Tensor, pl: torch.Tensor, out: torch.Tensor,
) -> Callable[[], None]:  # fmt: skip
    """Pass 1 of launch `name` into the partials po / pl (out: the Triton kernel's at 1 split)."""
    from troupe.kernels.decode_attention_fp8 import launch_split_fp8

    q = batch.q
    s, hq, dim = q.shape
    _, block_size, hkv, _ = k8.shape
    qk_scale = math.log2(math.e) / math.sqrt(dim)
    bn, st, w, _, _ = launch = parse(name)
    if name.startswith("triton"):
        return lambda: launch_split_fp8(
            q, k8, v8, out, po, pl, batch.block_tables, batch.seq_lens, None, None, scales,
            scales, qk_scale, 0, splits, block_n=bn, block_d=dim, num_warps=w, num_stages=st,
        )  # fmt: skip
    consts = constexprs(hq, hkv, dim, block_size, splits, launch)
    return lambda: fp8_decode_gluon_kernel[(hkv, s, splits)](
        q, k8, v8, po, pl, batch.block_tables, batch.seq_lens, scales, scales, qk_scale,
        q.stride(0), q.stride(1), batch.block_tables.stride(0), hkv * dim, **consts, num_warps=w,
    )  # fmt: skip


def run(l2: bool) -> None:
    """Every launch against the torch reference and timed; `l2`: each block table folded into a
    pool that stays in L2 (ops/h200_standin.py: the rate an H200's faster HBM could reach)."""
    from triton.testing import do_bench_cudagraph
    from troupe.kernels import reference
    from troupe.ops.card_rates import copy_bandwidth
    from troupe.ops.fp8_variant_sweep import fp8_decode_batch

    print(torch.cuda.get_device_name(), flush=True)
    copy = copy_bandwidth()
    for num_seqs, context in ((256, 1024), (64, 4096), (16, 16384)):
        batch, k8, v8, scales = fp8_decode_batch(num_seqs, context)
        if l2:
            batch = dataclasses.replace(batch, block_tables=folded_tables(batch.block_tables, 256))
        q = batch.q
        s, hq, dim = q.shape
        hkv = k8.shape[2]
        ref = reference.paged_decode_attention(
            q, k8, v8, batch.block_tables, batch.seq_lens, 1 / math.sqrt(dim), batch.max_seq_len,
            k_scale=scales, v_scale=scales,
        ).float()  # fmt: skip
        nbytes = 2 * int(batch.seq_lens.sum()) * hkv * dim + 2 * q.numel()
        base = max(1, min(32, 132 * 3 // (s * hkv)))
        for splits in sorted({base, 2, 4 * base}):
            for name in LAUNCHES:
                po = torch.zeros(s, hq, splits, dim, dtype=torch.float32, device="cuda")
                pl = torch.zeros(s, hq, splits, dtype=torch.float32, device="cuda")
                out = torch.zeros_like(q)
                call = launcher(name, batch, k8, v8, scales, splits, po, pl, out)
                call()
                if name.startswith("triton") and splits == 1:
                    got = out.float()
                else:  # the partials merged by their log-sum-exp
                    wts = torch.exp2(pl - pl.amax(-1, keepdim=True))
                    got = (po * wts[..., None]).sum(2) / wts.sum(-1)[..., None]
                err = (got - ref).abs().max().item()
                ms = do_bench_cudagraph(call)
                rate = nbytes / (ms * 1e-3)
                print(f"{num_seqs}x{context} splits {splits} {name}: {ms * 1e3:.1f} us, "
                      f"{rate / 1e12:.2f} TB/s, {rate / copy:.0%} of copy, max |err| {err:.2e}",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["compile"]:
        compile_only(sys.argv[2:])
    else:
        run(l2=sys.argv[1:2] == ["--l2"])
