"""Causal varlen prefill attention in Gluon with TMA and warp specialization (issue 9's 460).

    python -m troupe.ops.prefill_ws_probe compile   # no GPU: the sm_90 builds
    python -m troupe.ops.prefill_ws_probe           # GPU: against torch SDPA, TFLOP/s

Session 44's first run of ops/prefill_gluon_probe.py (cp.async by every thread, a CTA barrier
a key tile) was correct but slow on an H100: 270-290 TFLOP/s at 4 x 2,048 against the extend
kernel's 329 on the same card, its OVERLAP form slower than the plain one. The barriers keep
both warpgroups in lockstep and every thread spends issue slots on addresses.

This kernel moves the loads out of the compute warps, as FlashAttention-3 does: one producer
warp issues TMA copies of Q and of each K and V tile into rings (K and V on separate
barriers, so S_j starts before V_j lands); two compute warpgroups (64 query rows each), each
its own warp-specialized partition, wait on mbarriers and release slots with arrives, no CTA
barrier in the loop. Per tile, in one warpgroup's program order: S_j issued, P_{j-1}.V_{j-1}
issued, S_j waited, tile j's softmax while P.V runs on the tensor cores, P.V waited, the output
rescaled; pingpong (the fourth launch field) alternates the warpgroups' turns.

On an H100 (session 44): 428 TFLOP/s at 4 x 2,048 against the extend kernel's 329 and cuDNN's
462. Contiguous keys only: kernels/prefill_hopper.py is this kernel under the engine's
contract (paged prefix, qkv rows, tile grid).

Keys past a sequence's end are the next sequence's (or TMA's zero fill past the tensor):
masked in the scores, multiplied by P = 0 in P.V.
"""

# Gluon kernels take untyped pointers and constexprs; @gluon.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from troupe.ops.prefill_gluon_probe import _softmax_step


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, bars, q_row, q_col, k_row0, kv_col,
              n_tiles, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """One warp: both warpgroups' Q, then each key tile's K and V into ring slots once free."""
    q_bar, k_ready, k_empty, v_ready, v_empty, _ = bars
    half: gl.constexpr = q_desc.block_type.shape[0]
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, q_col], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row + half, q_col], q_bar, q_smem.index(1))
    for j in range(n_tiles):
        slot = j % STAGES
        phase = (j // STAGES) & 1
        row = k_row0 + j * BLOCK_N
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row, kv_col], k_ready.index(slot),
                                        k_ring.index(slot))  # fmt: skip
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [row, kv_col], v_ready.index(slot),
                                        v_ring.index(slot))  # fmt: skip


@gluon.jit
def _my_turn(turn, wg: gl.constexpr, k, PINGPONG: gl.constexpr):
    """FA3's warpgroup schedule: a warpgroup issues its k-th batch of wgmma only after the other
    has issued its own (k-1)-th, so one's softmax runs under the other's matmuls."""
    if PINGPONG:
        mbarrier.wait(turn.index(wg), k & 1)


@gluon.jit
def _pass_turn(turn, wg: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - wg), count=1)


@gluon.jit
def _consumer(q_smem, k_ring, v_ring, bars, o_ptr, stride_ot, stride_oh, start, seq_len, m0,
              head, n_tiles, qk_scale, wg: gl.constexpr, HEAD_DIM: gl.constexpr,
              ROWS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              PINGPONG: gl.constexpr):  # fmt: skip
    """One warpgroup: query rows m0 + wg * ROWS .. + ROWS against every key tile of the block."""
    q_bar, k_ready, k_empty, v_ready, v_empty, turn = bars
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    r0 = m0 + wg * ROWS
    q = q_smem.index(wg)
    rows = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma_s))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_s))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma_s))
    l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, mma_s))
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=mma_o)
    zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=mma_s)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    _my_turn(turn, wg, 0, PINGPONG)
    s_tok = warpgroup_mma(q, k_ring.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
    _pass_turn(turn, wg, PINGPONG)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    mbarrier.arrive(k_empty.index(0), count=1)
    p16, alpha_o, m_i, l_i = _softmax_step(
        s, 0, r0, seq_len, rows, cols, m_i, l_i, qk_scale, BLOCK_N, mma_o, p_l
    )
    for j in range(1, n_tiles):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        _my_turn(turn, wg, j, PINGPONG)
        s_tok = warpgroup_mma(
            q, k_ring.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True
        )
        pv_tok = warpgroup_mma(p16, v_ring.index(prev), acc, is_async=True)
        _pass_turn(turn, wg, PINGPONG)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        mbarrier.arrive(k_empty.index(slot), count=1)
        p16, alpha_o, m_i, l_i = _softmax_step(
            s, j * BLOCK_N, r0, seq_len, rows, cols, m_i, l_i, qk_scale, BLOCK_N, mma_o, p_l
        )
        acc = warpgroup_mma_wait(0, deps=[pv_tok])
        mbarrier.arrive(v_empty.index(prev), count=1)
        acc = acc * alpha_o[:, None]
    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
    _my_turn(turn, wg, n_tiles, PINGPONG)
    pv_tok = warpgroup_mma(p16, v_ring.index(last), acc, is_async=True)
    _pass_turn(turn, wg, PINGPONG)
    acc = warpgroup_mma_wait(0, deps=[pv_tok])

    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, mma_o))
    o = acc / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
    r = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma_o))
    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, mma_o))
    optr = o_ptr + (start + r).to(gl.int64)[:, None] * stride_ot + head * stride_oh + d[None, :]
    gl.store(optr, o.to(gl.bfloat16), mask=(r < seq_len)[:, None] & (d < HEAD_DIM)[None, :])


@gluon.jit
def prefill_ws_kernel(
    q_desc,
    k_desc,
    v_desc,
    o_ptr,
    cu_ptr,
    qk_scale,
    stride_ot,
    stride_oh,
    GROUP: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    PINGPONG: gl.constexpr,
):
    ROWS: gl.constexpr = q_desc.block_type.shape[0]  # a warpgroup's query rows; two a program
    m_block = gl.num_programs(0) - 1 - gl.program_id(0)  # the longest (last) blocks first
    head = gl.program_id(1)
    seq = gl.program_id(2)
    start = gl.load(cu_ptr + seq)
    seq_len = gl.load(cu_ptr + seq + 1) - start
    m0 = m_block * 2 * ROWS
    if m0 < seq_len:
        n_tiles = gl.cdiv(gl.minimum(seq_len, m0 + 2 * ROWS), BLOCK_N)  # causal
        q_smem = gl.allocate_shared_memory(gl.bfloat16, [2, ROWS, HEAD_DIM], q_desc.layout)
        k_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_DIM],
                                           k_desc.layout)  # fmt: skip
        v_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_DIM],
                                           v_desc.layout)  # fmt: skip
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)  # one arrive a warpgroup
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=2)
        mbarrier.init(turn.index(0), count=1)
        mbarrier.init(turn.index(1), count=1)
        mbarrier.arrive(turn.index(0), count=1)  # warpgroup 0 issues first
        bars = (q_bar, k_ready, k_empty, v_ready, v_empty, turn)
        # fmt: off
        gl.warp_specialize(
            [(_consumer, (q_smem, k_ring, v_ring, bars, o_ptr, stride_ot, stride_oh, start,
                          seq_len, m0, head, n_tiles, qk_scale, 0, HEAD_DIM, ROWS, BLOCK_N,
                          STAGES, PINGPONG)),
             (_consumer, (q_smem, k_ring, v_ring, bars, o_ptr, stride_ot, stride_oh, start,
                          seq_len, m0, head, n_tiles, qk_scale, 1, HEAD_DIM, ROWS, BLOCK_N,
                          STAGES, PINGPONG)),
             (_producer, (q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, bars, start + m0,
                          head * HEAD_DIM, start, (head // GROUP) * HEAD_DIM, n_tiles, BLOCK_N,
                          STAGES))],
            [4, 1], [240, 24],
        )
        # fmt: on


LAUNCHES = ("128/128/2/1", "128/128/2/0", "128/64/3/1", "128/128/3/1")  # bm/bn/stages/pingpong
MAXNREG = 168  # 12 warps (the producer's warpgroup counted) x 168 = the register file


def constexprs(group: int, head_dim: int, name: str) -> dict[str, object]:
    _, bn, st, pingpong = (int(x) for x in name.split("/"))
    return {"GROUP": group, "HEAD_DIM": head_dim, "BLOCK_N": bn, "STAGES": st,
            "PINGPONG": bool(pingpong)}  # fmt: skip


def descriptors(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int, block_n: int
) -> tuple[object, object, object]:
    """TMA descriptors over [T, H * D] views (rows as the projection lays them out)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    def desc(t: torch.Tensor, rows: int) -> object:
        dim = t.shape[2]
        layout = gl.NVMMASharedLayout.get_default_for([rows, dim], gl.bfloat16)
        return TensorDescriptor(t, [t.shape[0], t.shape[1] * dim], [t.stride(0), 1], [rows, dim],
                                layout)  # fmt: skip

    return desc(q, block_m // 2), desc(k, block_n), desc(v, block_n)


def compile_only(names: list[str]) -> None:
    """The launches (those named, else all) built for sm_90: registers, spills, shared memory."""
    from triton._C.libtriton import native_specialize_impl
    from troupe.ops.sm90_compile import compile_sm90

    for name in LAUNCHES:
        if names and name not in names:
            continue
        bm, bn = (int(x) for x in name.split("/")[:2])
        t = torch.empty(64, 2, 128, dtype=torch.bfloat16)
        qd, kd, vd = descriptors(t, t, t, bm, bn)
        types = {n: native_specialize_impl(type(d), d, False, True, True)[0]
                 for n, d in (("q_desc", qd), ("k_desc", kd), ("v_desc", vd))}  # fmt: skip
        types |= {"cu_ptr": "*i32", "qk_scale": "fp32", "o_ptr": "*bf16"}
        build = compile_sm90(prefill_ws_kernel, constexprs(2, 128, name), types, 4, 1,
                             sass=True, maxnreg=MAXNREG)  # fmt: skip
        wgmma = sum(1 for line in build.sass.splitlines() if "HGMMA" in line)
        print(f"{name}: {build.regs} registers, stack {build.stack}, {build.smem} bytes of "
              f"shared memory, {wgmma} HGMMA", flush=True)  # fmt: skip


def launcher(
    name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    cu: torch.Tensor, max_len: int,
) -> Callable[[], None]:  # fmt: skip
    """One launch of `name` over the ragged batch (cu: cumulative lengths) into out."""
    hq, dim = q.shape[1], q.shape[2]
    bm, bn = (int(x) for x in name.split("/")[:2])
    consts = constexprs(hq // k.shape[1], dim, name)
    qd, kd, vd = descriptors(q, k, v, bm, bn)
    grid = (triton.cdiv(max_len, bm), hq, cu.numel() - 1)
    return lambda: prefill_ws_kernel[grid](
        qd, kd, vd, out, cu, math.log2(math.e) / math.sqrt(dim), out.stride(0), out.stride(1),
        **consts, num_warps=4, maxnreg=MAXNREG,
    )  # fmt: skip


def run() -> None:
    """Qwen3-0.6B heads (16 q, 8 kv, head_dim 128), bf16, 4 x 2,048 and 16 x 512 new tokens and
    a ragged batch: each launch against torch SDPA per sequence, its TFLOP/s (pairs counted as
    ops/kernel_bench.py counts them), and the cp.async probe's best form beside it."""
    from triton.testing import do_bench
    from troupe.ops import prefill_gluon_probe as old

    print(torch.cuda.get_device_name(), flush=True)
    for lens in ([2048] * 4, [512] * 16, [1, 700, 129, 2048, 64]):
        q, k, v, cu, ref = old.problem(lens)
        flops = 4 * sum(n * (n + 1) // 2 for n in lens) * q.shape[1] * q.shape[2]
        forms = [(n, launcher) for n in LAUNCHES] + [("cp.async 128/64/3/8/0", None)]
        for name, make in forms:
            out = torch.zeros_like(q)
            if make is None:
                call = old.launcher(name.split()[1], q, k, v, out, cu, max(lens))
            else:
                call = make(name, q, k, v, out, cu, max(lens))
            call()
            err = (out.float() - ref.float()).abs().max().item()
            ms = do_bench(call)
            print(f"{len(lens)} x {max(lens)} {name}: {ms * 1e3:.1f} us, "
                  f"{flops / (ms * 1e-3) / 1e12:.0f} TFLOP/s, max |err| {err:.2e}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    compile_only(sys.argv[2:]) if sys.argv[1:2] == ["compile"] else run()
