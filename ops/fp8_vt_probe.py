"""The fp8 decode with values stored transposed within a page: a probe (issue 12).

    python -m troupe.ops.fp8_vt_probe compile      # no GPU: sm_90 builds against the engine's
    python -m troupe.ops.fp8_vt_probe              # GPU: timed as ops/h200_standin.py times

The engine's fp8 kernel (kernels/decode_attention_fp8.py) reads V's tile back from shared memory
a byte at a time (LDS.U8): P V's B operand wants two consecutive tokens of one dimension in a
register, and in the [slot, head, dim] cache those are a row (1 KB at Llama's 8 x 128) apart.
Here V's pages are [head, dim, slot] (vLLM's first paged kernel kept values so): a dimension's
tokens are adjacent bytes, as K's dimensions are for QK^T, so the same conversion at the dot
reads them in words. K and the rest are the engine kernel's (pages of whole tiles only, no
window, no sequence order or limit); each split writes fp32 partials and their log-sum-exp,
merged here in torch. Not wired into the engine: every writer and reader of V would change.

A tile is four pages, each loaded as its own 2-D tiles (K [slot, dim], V^T [dim, slot]) masked
by page, so the loads stay vectors; the scores of the four pages share one running max (their
elementwise max, then one row reduction), and only a split's last tile zeroes stale slots.
Built for sm_90 (session 46, triton 3.7.1, `compile`, at 64 / 2 / 5): no byte reads of shared
memory, 0.152 warp instructions a KV byte against the engine kernel's 0.139 (190 registers, 41
KB: 5 programs an SM, as the engine's). Earlier forms took more: four row reductions 0.169, the
tile as one [dim, token] or [page, dim, slot] load 0.28-0.30 (Triton byte-loading or permuting
the transposed tile). Not yet timed on a GPU (`python -m troupe.ops.fp8_vt_probe` does it,
beside the engine's kernel).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from troupe.kernels.decode_attention import (
    DecodeConfig,
    choose_num_splits,
    paged_decode_attention_triton,
)
from troupe.kernels.paged_batch import PagedBatch

_F16_MAX = tl.constexpr(65504.0)


@triton.jit
def _page(k_cache_ptr, vt_cache_ptr, bt_row, n, j: tl.constexpr, end, kv_head, offs_d,
          PAGE_K: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
          BLOCK_SIZE: tl.constexpr):  # fmt: skip
    """Page j of the tile at n: K [slot, dim] and V^T [dim, slot] as bytes, masked by page (one
    predicate a row: the loads stay vectors), and which of its slots are keys."""
    first = n + j * BLOCK_SIZE
    live = first < end
    base = tl.load(bt_row + first // BLOCK_SIZE, mask=live, other=0).to(tl.int64) * PAGE_K
    within = tl.arange(0, BLOCK_SIZE)
    k8 = tl.load(k_cache_ptr + base + within[:, None] * (NUM_KV_HEADS * HEAD_DIM)
                 + kv_head * HEAD_DIM + offs_d[None, :], mask=live, other=0.0)  # fmt: skip
    vt8 = tl.load(vt_cache_ptr + base + (kv_head * HEAD_DIM + offs_d)[:, None] * BLOCK_SIZE
                  + within[None, :], mask=live, other=0.0)  # fmt: skip
    return k8, vt8, first + within < end


@triton.jit
def _scores(q, k8, ok, qk_scale):
    """q K^T of one page (base 2), keys past the end at -inf."""
    s = tl.dot(q, tl.trans(k8.to(tl.float16))) * qk_scale
    return tl.where(ok[None, :], s, float("-inf"))


@triton.jit
def _values(vt8, ok, tail):
    """One page's V [slot, dim] in fp16; on the split's last tile (`tail`) the slots past the
    end zeroed (a stale slot may hold an fp8 NaN, and 0 x NaN is NaN)."""
    v = tl.trans(vt8.to(tl.float16))
    if tail:
        v = tl.where(ok[:, None], v, 0.0)
    return v


@triton.jit
def fp8_vt_decode_kernel(
    q_ptr, k_cache_ptr, vt_cache_ptr, part_out_ptr, part_lse_ptr, block_tables_ptr,
    seq_lens_ptr, k_scale_ptr, v_scale_ptr, qk_scale, stride_qs, stride_qh, stride_bt,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    kv_head = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    qk_scale = qk_scale * tl.load(k_scale_ptr + kv_head)
    v_scale = tl.load(v_scale_ptr + kv_head)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + offs_g
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                mask=(offs_g < GROUP)[:, None], other=0.0)  # fmt: skip
    q = tl.clamp(q.to(tl.float32), -_F16_MAX, _F16_MAX).to(tl.float16)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    tl.static_assert(BLOCK_N == 4 * BLOCK_SIZE, "a tile is four pages")
    PAGE_K: tl.constexpr = BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM  # a page's bytes, K or V
    bt_row = block_tables_ptr + seq * stride_bt
    for n in range(start, end, BLOCK_N):
        k0, v0, ok0 = _page(k_cache_ptr, vt_cache_ptr, bt_row, n, 0, end, kv_head, offs_d,
                            PAGE_K, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)  # fmt: skip
        k1, v1, ok1 = _page(k_cache_ptr, vt_cache_ptr, bt_row, n, 1, end, kv_head, offs_d,
                            PAGE_K, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)  # fmt: skip
        k2, v2, ok2 = _page(k_cache_ptr, vt_cache_ptr, bt_row, n, 2, end, kv_head, offs_d,
                            PAGE_K, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)  # fmt: skip
        k3, v3, ok3 = _page(k_cache_ptr, vt_cache_ptr, bt_row, n, 3, end, kv_head, offs_d,
                            PAGE_K, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)  # fmt: skip
        s0 = _scores(q, k0, ok0, qk_scale)
        s1 = _scores(q, k1, ok1, qk_scale)
        s2 = _scores(q, k2, ok2, qk_scale)
        s3 = _scores(q, k3, ok3, qk_scale)
        # the pages' scores share a layout: their elementwise max, then one row reduction
        top = tl.maximum(tl.maximum(s0, s1), tl.maximum(s2, s3))
        m_new = tl.maximum(m_i, tl.max(top, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p0 = tl.exp2(s0 - m_new[:, None])
        p1 = tl.exp2(s1 - m_new[:, None])
        p2 = tl.exp2(s2 - m_new[:, None])
        p3 = tl.exp2(s3 - m_new[:, None])
        l_i = l_i * alpha + tl.sum((p0 + p1) + (p2 + p3), axis=1)
        acc = acc * alpha[:, None]
        tail = n + BLOCK_N > end
        acc = tl.dot(p0.to(tl.float16), _values(v0, ok0, tail), acc)
        acc = tl.dot(p1.to(tl.float16), _values(v1, ok1, tail), acc)
        acc = tl.dot(p2.to(tl.float16), _values(v2, ok2, tail), acc)
        acc = tl.dot(p3.to(tl.float16), _values(v3, ok3, tail), acc)
        m_i = m_new
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc * (v_scale / l_safe)[:, None]
    row = (seq * NUM_Q_HEADS + heads) * NUM_SPLITS + split
    tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], o,
             mask=(offs_g < GROUP)[:, None])  # fmt: skip
    tl.store(part_lse_ptr + row, m_i + tl.log2(l_safe), mask=offs_g < GROUP)


def transposed_values(v_cache: torch.Tensor) -> torch.Tensor:
    """[blocks, slot, head, dim] -> [blocks, head, dim, slot] (contiguous)."""
    return v_cache.permute(0, 2, 3, 1).contiguous()


def constexprs(num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
               num_splits: int, block_n: int) -> dict[str, object]:  # fmt: skip
    group = num_q_heads // num_kv_heads
    return {
        "NUM_Q_HEADS": num_q_heads, "NUM_KV_HEADS": num_kv_heads, "GROUP": group,
        "HEAD_DIM": head_dim, "BLOCK_SIZE": block_size, "NUM_SPLITS": num_splits,
        "BLOCK_G": max(16, triton.next_power_of_2(group)), "BLOCK_N": block_n,
    }  # fmt: skip


def decode_vt(
    q: torch.Tensor, k8: torch.Tensor, vt8: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor, scale: float,
    num_splits: int, *, block_n: int = 64, num_warps: int = 2, num_stages: int = 5,
) -> torch.Tensor:  # fmt: skip
    """Attention of one query token per sequence over the fp8 cache (V transposed), [S, Hq, D]
    in fp32: pass 1, then the splits merged by their log-sum-exp."""
    s, hq, dim = q.shape
    block_size, hkv = k8.shape[1], k8.shape[2]
    assert block_n % block_size == 0, "tiles of whole pages"
    part = torch.empty(s, hq, num_splits, dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(s, hq, num_splits, dtype=torch.float32, device=q.device)
    fp8_vt_decode_kernel[(hkv, s, num_splits)](
        q, k8, vt8, part, lse, block_tables, seq_lens, k_scale, v_scale,
        scale * math.log2(math.e), q.stride(0), q.stride(1), block_tables.stride(0),
        **constexprs(hq, hkv, dim, block_size, num_splits, block_n),
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    weights = torch.exp2(lse - lse.amax(-1, keepdim=True))
    return (part * weights[..., None]).sum(2) / weights.sum(-1)[..., None]


# block_n / warps / stages; a tile is four pages, so 64 keys at the engine's pages of 16
LAUNCHES = ((64, 2, 5), (64, 2, 3), (64, 4, 5))


def compile_only() -> None:
    """The probe's launches and the engine kernel's built for sm_90 (Llama-3.1-8B heads, pages
    of 16): registers, shared memory, the main loop's opcodes (fp8_compile_check's figures)."""
    from troupe.ops.fp8_compile_check import _TYPES, compile_candidate, loop_figures
    from troupe.ops.sm90_compile import compile_sm90

    types = {**_TYPES, "vt_cache_ptr": "*fp8e4nv"}
    for block_n, warps, stages in LAUNCHES:
        engine = compile_candidate(DecodeConfig(block_n, warps, stages), None)
        build = compile_sm90(fp8_vt_decode_kernel, constexprs(32, 8, 128, 16, 2, block_n), types,
                             warps, stages, sass=True)  # fmt: skip
        vt = {"regs": build.regs, "smem": build.smem, **loop_figures(build.sass, warps, block_n)}
        for name, info in (("engine", engine), ("vt", vt)):
            figures = " ".join(f"{k} {v}" for k, v in info.items())
            print(f"{name:<6} {block_n}/{warps}/{stages}: {figures}", flush=True)


def _vt_call(batch: PagedBatch, k8: torch.Tensor, vt8: torch.Tensor, scales: torch.Tensor,
             config: DecodeConfig, sms: int) -> Callable[[], torch.Tensor]:  # fmt: skip
    """decode_vt at the engine's split policy for `sms` SMs."""
    splits = choose_num_splits(batch.q.shape[0], k8.shape[2], batch.max_seq_len, sms, config)
    return functools.partial(
        decode_vt, batch.q, k8, vt8, batch.block_tables, batch.seq_lens, scales, scales,
        1 / math.sqrt(batch.q.shape[-1]), splits, block_n=config.block_n,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip


def run() -> None:
    """Each launch against the torch reference and timed: the whole card with L2 flushed, and
    as an H200 would run it (ops/h200_standin.SmShare), beside the engine's kernel."""
    from troupe.kernels import reference
    from troupe.kernels.sm_count import num_sms
    from troupe.ops.bench_timing import flushed_graph_ms
    from troupe.ops.fp8_variant_sweep import SHAPES, fp8_decode_batch
    from troupe.ops.h200_standin import SmShare

    share = SmShare(96)
    print(torch.cuda.get_device_name(), flush=True)
    for num_seqs, context in SHAPES:
        batch, k8, v8, scales = fp8_decode_batch(num_seqs, context)
        vt8 = transposed_values(v8)
        scale = 1 / math.sqrt(128)
        rest = (batch.block_tables, batch.seq_lens, scale, batch.max_seq_len)
        ref = reference.paged_decode_attention(batch.q, k8, v8, *rest, k_scale=scales,
                                               v_scale=scales).float()  # fmt: skip
        nbytes = 2 * int(batch.seq_lens.sum()) * 8 * 128 + 4 * batch.q.numel()
        for block_n, warps, stages in LAUNCHES:
            config = DecodeConfig(block_n, warps, stages)
            engine = functools.partial(paged_decode_attention_triton, batch.q, k8, v8, *rest,
                                       config=config, k_scale=scales, v_scale=scales)  # fmt: skip
            forms: dict[str, tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]] = {
                # (the whole card's call, the share's): the engine's reads the SMs counted
                "engine": (engine, engine),
                "vt": (_vt_call(batch, k8, vt8, scales, config, num_sms(batch.q.device)),
                       _vt_call(batch, k8, vt8, scales, config, share.sms)),
            }  # fmt: skip
            for name, (whole_call, share_call) in forms.items():
                err = float((whole_call().float() - ref).norm() / ref.norm())
                whole = nbytes / (flushed_graph_ms(whole_call) * 1e-3)
                part = nbytes / (share.run(functools.partial(flushed_graph_ms, share_call)) * 1e-3)
                print(f"{num_seqs}x{context} {name:<6} {block_n}/{warps}/{stages}: whole card "
                      f"{whole / 1e12:.2f} TB/s, as H200 {share.as_h200(part):.0%}, "
                      f"rel err {err:.1e}",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["compile"]:
        compile_only()
    else:
        run()
