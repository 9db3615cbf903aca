"""Causal varlen prefill attention written in Gluon for Hopper (wgmma): a probe (issue 9).

    python -m troupe.ops.prefill_gluon_probe compile   # no GPU: the sm_90 builds
    python -m troupe.ops.prefill_gluon_probe           # GPU: against torch SDPA, TFLOP/s

Issue 9 asks 460 TFLOP/s of paged prefill attention at 4 x 2,048 new tokens; the engine's
extend kernel (kernels/extend_attention.py) runs 345 on the H200 and session 33's Triton probe
over contiguous keys reached ~420: Triton's loop runs the online softmax between the two
matmuls, with the tensor cores idle (ncu, session 36). FlashAttention-3 closes that gap by
overlapping the softmax of one key tile with the scores of the next, which Triton does not
express and Gluon (Triton's explicit dialect, in 3.6 and 3.7) does: warpgroup_mma with
is_async=True and warpgroup_mma_wait(1).

The kernel: one program per (128 query rows, q head, sequence) over new tokens laid out
[T, H, D] (what the qkv projection's rows hold), K/V tiles by cp.async into a ring of
NVMMA-swizzled shared buffers (STAGES deep), S = Q K^T and O += P V as wgmma (P from
registers), causal and length masks on S, the softmax in exp2 with fp32 statistics. OVERLAP
(the fifth launch field): S_{j+1} is issued before tile j's softmax and P_j V_j runs while the
next loads are issued; otherwise each wgmma is waited where issued.

Correct on an H100 (session 44) and slow: 270-290 TFLOP/s at 4 x 2,048, under the extend kernel.
The TMA and warp-specialized form (ops/prefill_ws_probe.py until 5ef161a: 428 TFLOP/s on the
same card) is kernels/prefill_hopper.py; this probe keeps that kernel's softmax step.
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
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from troupe.kernels.prefill_hopper_kernel import softmax_step

# triton 3.6 names the CTA barrier thread_barrier, 3.7 barrier
_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier


@gluon.jit
def _rows_ptrs(
    base, row0, limit, stride_t, HEAD_DIM: gl.constexpr, ROWS: gl.constexpr, layout: gl.constexpr
):
    r = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    ok = (r < limit)[:, None] & (d < HEAD_DIM)[None, :]
    return base + r.to(gl.int64)[:, None] * stride_t + d[None, :], ok


@gluon.jit
def _issue_kv(
    k_base,
    v_base,
    k_slot,
    v_slot,
    row0,
    limit,
    stride_kt,
    HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr,
    layout: gl.constexpr,
):
    kp, ok = _rows_ptrs(k_base, row0, limit, stride_kt, HEAD_DIM, BLOCK_N, layout)
    async_copy.async_copy_global_to_shared(k_slot, kp, mask=ok)
    vp, ok = _rows_ptrs(v_base, row0, limit, stride_kt, HEAD_DIM, BLOCK_N, layout)
    async_copy.async_copy_global_to_shared(v_slot, vp, mask=ok)
    async_copy.commit_group()


@gluon.jit
def _issue_ahead(k_base, v_base, k_ring, v_ring, j, start, n_end, stride_kt, STAGES: gl.constexpr,
                 HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr):  # fmt: skip
    """At key tile j: the loads of tile j + STAGES - 1 into its ring slot (that of tile j - 1)."""
    ahead = j + STAGES - 1
    _issue_kv(k_base, v_base, k_ring.index(ahead % STAGES), v_ring.index(ahead % STAGES),
              start + ahead * BLOCK_N, start + n_end, stride_kt, HEAD_DIM, BLOCK_N, layout)  # fmt: skip


@gluon.jit
def prefill_gluon_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    cu_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_ot,
    stride_oh,
    GROUP: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    NUM_WARPS: gl.constexpr,
    OVERLAP: gl.constexpr,
):
    load_l: gl.constexpr = gl.BlockedLayout(
        [1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [NUM_WARPS, 1], [1, 0]
    )
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, BLOCK_N, 16]
    )
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    smem_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    m_block = gl.num_programs(0) - 1 - gl.program_id(0)  # the longest (last) blocks first
    head = gl.program_id(1)
    seq = gl.program_id(2)
    kv_head = head // GROUP
    start = gl.load(cu_ptr + seq)
    seq_len = gl.load(cu_ptr + seq + 1) - start
    m0 = m_block * BLOCK_M
    if m0 >= seq_len:
        return
    end = start + seq_len
    q_base = q_ptr + head * stride_qh
    k_base = k_ptr + kv_head * stride_kh
    v_base = v_ptr + kv_head * stride_kh

    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, HEAD_DIM], smem_l)
    k_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_DIM], smem_l)
    v_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_DIM], smem_l)
    qp, ok = _rows_ptrs(q_base, start + m0, end, stride_qt, HEAD_DIM, BLOCK_M, load_l)
    async_copy.async_copy_global_to_shared(q_smem, qp, mask=ok)
    async_copy.commit_group()

    n_end = gl.minimum(seq_len, m0 + BLOCK_M)  # causal: keys up to the block's last query
    n_tiles = gl.cdiv(n_end, BLOCK_N)
    for i in gl.static_range(STAGES - 1):
        _issue_kv(
            k_base,
            v_base,
            k_ring.index(i),
            v_ring.index(i),
            start + i * BLOCK_N,
            start + n_end,
            stride_kt,
            HEAD_DIM,
            BLOCK_N,
            load_l,
        )

    rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_s))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_s))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma_s))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, mma_s))
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=mma_o)
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=mma_s)
    if OVERLAP:
        # FA3's overlap in one warpgroup's program order: S_{j+1} runs on the tensor cores
        # while tile j's softmax runs, and P_j.V_j while the next loads are issued.
        async_copy.wait_group(STAGES - 2)  # q and tile 0
        _barrier()
        fence_async_shared()
        s_tok = warpgroup_mma(
            q_smem, k_ring.index(0).permute((1, 0)), zero, use_acc=False, is_async=True
        )
        pv_tok = warpgroup_mma_init(acc)
        for j in range(0, n_tiles):
            async_copy.wait_group(STAGES - 3)  # tile j + 1 (past the end: zeros, unused)
            _barrier()
            fence_async_shared()
            nxt = (j + 1) % STAGES
            s_next = warpgroup_mma(
                q_smem, k_ring.index(nxt).permute((1, 0)), zero, use_acc=False, is_async=True
            )
            s, acc = warpgroup_mma_wait(1, deps=[s_tok, pv_tok])  # S_j; P_{j-1}.V_{j-1} done
            _barrier()  # every warpgroup is done with slot (j - 1) % STAGES: refill it
            _issue_ahead(k_base, v_base, k_ring, v_ring, j, start, n_end, stride_kt, STAGES,
                         HEAD_DIM, BLOCK_N, load_l)  # fmt: skip
            p16, alpha_o, m_i, l_i = softmax_step(
                s, j * BLOCK_N, seq_len, 0, m0, rows, cols, m_i, l_i, qk_scale, BLOCK_N, mma_o,
                p_l,
            )  # fmt: skip
            pv_tok = warpgroup_mma(
                p16, v_ring.index(j % STAGES), acc * alpha_o[:, None], is_async=True
            )
            s_tok = s_next
        s, acc = warpgroup_mma_wait(0, deps=[s_tok, pv_tok])
    else:
        for j in range(0, n_tiles):
            _barrier()  # every warp is done with the slot refilled below (read at j - 1)
            _issue_ahead(k_base, v_base, k_ring, v_ring, j, start, n_end, stride_kt, STAGES,
                         HEAD_DIM, BLOCK_N, load_l)  # fmt: skip
            async_copy.wait_group(STAGES - 1)
            _barrier()
            fence_async_shared()
            cur = j % STAGES
            s = warpgroup_mma(q_smem, k_ring.index(cur).permute((1, 0)), zero, use_acc=False)
            p16, alpha_o, m_i, l_i = softmax_step(
                s, j * BLOCK_N, seq_len, 0, m0, rows, cols, m_i, l_i, qk_scale, BLOCK_N, mma_o,
                p_l,
            )  # fmt: skip
            acc = warpgroup_mma(p16, v_ring.index(cur), acc * alpha_o[:, None])
    async_copy.wait_group(0)

    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, mma_o))
    o = acc / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
    r = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_o))
    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, mma_o))
    optr = o_ptr + (start + r).to(gl.int64)[:, None] * stride_ot + head * stride_oh + d[None, :]
    gl.store(optr, o.to(gl.bfloat16), mask=(r < seq_len)[:, None] & (d < HEAD_DIM)[None, :])


LAUNCHES = (  # block_m / block_n / stages / warps / OVERLAP
    "128/64/4/8/1", "128/64/3/8/1", "64/64/4/4/1", "128/64/3/8/0", "128/64/2/8/0",
)  # fmt: skip


def constexprs(group: int, head_dim: int, name: str) -> dict[str, object]:
    bm, bn, st, w, overlap = (int(x) for x in name.split("/"))
    return {
        "GROUP": group, "HEAD_DIM": head_dim, "BLOCK_M": bm, "BLOCK_N": bn, "STAGES": st,
        "NUM_WARPS": w, "OVERLAP": bool(overlap),
    }  # fmt: skip


def compile_only(names: list[str]) -> None:
    """The launches (those named, else all) built for sm_90: registers, spills, shared memory."""
    from troupe.ops.sm90_compile import compile_sm90

    types = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*bf16",
             "cu_ptr": "*i32", "qk_scale": "fp32"}  # fmt: skip
    for name in LAUNCHES:
        if names and name not in names:
            continue
        warps = int(name.split("/")[3])
        build = compile_sm90(prefill_gluon_kernel, constexprs(2, 128, name), types, warps, 1,
                             sass=True)  # fmt: skip
        wgmma = sum(1 for line in build.sass.splitlines() if "HGMMA" in line)
        print(f"{name}: {build.regs} registers, stack {build.stack}, {build.smem} bytes of "
              f"shared memory, {wgmma} HGMMA", flush=True)  # fmt: skip


def launcher(
    name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    cu: torch.Tensor, max_len: int,
) -> Callable[[], None]:  # fmt: skip
    """One launch of `name` over the ragged batch (cu: cumulative lengths) into out."""
    hq, dim = q.shape[1], q.shape[2]
    block_m, warps = int(name.split("/")[0]), int(name.split("/")[3])
    consts = constexprs(hq // k.shape[1], dim, name)
    return lambda: prefill_gluon_kernel[(triton.cdiv(max_len, block_m), hq, cu.numel() - 1)](
        q, k, v, out, cu, math.log2(math.e) / math.sqrt(dim), q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), out.stride(0), out.stride(1), **consts, num_warps=warps,
    )  # fmt: skip


def problem(lens: list[int]) -> tuple[torch.Tensor, ...]:
    """Qwen3-0.6B heads (16 q, 8 kv, head_dim 128), bf16, new tokens of the given lengths laid
    out [T, H, D]: q, k, v, the cumulative lengths, and torch SDPA's causal output per sequence."""
    from itertools import accumulate

    hq, hkv, dim = 16, 8, 128
    total = sum(lens)
    torch.manual_seed(0)
    q = torch.randn(total, hq, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(total, hkv, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(total, hkv, dim, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, *accumulate(lens)], device="cuda", dtype=torch.int32)
    ref = torch.empty_like(q)
    for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        qs, ks, vs = (t[lo:hi].transpose(0, 1) for t in (q, k, v))
        ref[lo:hi] = torch.nn.functional.scaled_dot_product_attention(
            qs, ks, vs, is_causal=True, enable_gqa=True
        ).transpose(0, 1)
    return q, k, v, cu, ref


def run() -> None:
    """4 x 2,048 and 16 x 512 new tokens: each launch against torch SDPA per sequence (flash)
    and its TFLOP/s, pairs counted as ops/kernel_bench.py counts them."""
    from triton.testing import do_bench

    print(torch.cuda.get_device_name(), flush=True)
    for lens in ([2048] * 4, [512] * 16):
        q, k, v, cu, ref = problem(lens)
        flops = 4 * sum(n * (n + 1) // 2 for n in lens) * q.shape[1] * q.shape[2]
        for name in LAUNCHES:
            out = torch.zeros_like(q)
            call = launcher(name, q, k, v, out, cu, max(lens))
            call()
            err = (out.float() - ref.float()).abs().max().item()
            ms = do_bench(call)
            print(f"{len(lens)} x {lens[0]} {name}: {ms * 1e3:.1f} us, "
                  f"{flops / (ms * 1e-3) / 1e12:.0f} TFLOP/s, max |err| {err:.2e}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    compile_only(sys.argv[2:]) if sys.argv[1:2] == ["compile"] else run()
