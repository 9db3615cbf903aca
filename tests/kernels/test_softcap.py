"""Gemma 2's soft-capped attention scores (kernels/softcap.py) in every attention op: the torch
reference against transformers' eager formula written out, and the Triton decode, fp8 decode,
paged and extend kernels (fp32 under TRITON_INTERPRET=1) against the reference, windowed too.
Queries are scaled up so that most scores pass the cap: without it the outputs differ."""

from __future__ import annotations

import math

import pytest
import torch
from fp8_batch import fp8_batch, rel_err
from troupe.kernels import reference
from troupe.kernels.decode_attention import paged_decode_attention_triton
from troupe.kernels.extend_attention import extend_attention_triton
from troupe.kernels.paged_attention import paged_attention_triton
from troupe.kernels.paged_batch import PagedBatch, fused_new_kv, make_paged_batch

CAP = 2.0
PREFILL = [(0, 13), (9, 7), (21, 1)]  # (cached prefix, new tokens): a prompt, a chunk, a decode
DECODE = [(20, 1), (6, 1), (37, 1)]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]  # fp32 on both


def _batch(lens: list[tuple[int, int]], seed: int, device: str = "cpu") -> PagedBatch:
    batch = make_paged_batch(
        lens, num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.float32,
        device=device, seed=seed,
    )  # fmt: skip
    batch.q.mul_(4.0)  # scores well past CAP
    return batch


def _args(batch: PagedBatch) -> tuple:
    return (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, 1 / math.sqrt(batch.q.shape[2]))  # fmt: skip


def _eager(batch: PagedBatch, window: int) -> torch.Tensor:
    """transformers' Gemma 2 eager attention, one sequence at a time, keys gathered in order."""
    out = torch.empty_like(batch.q)
    scale = 1 / math.sqrt(batch.q.shape[2])
    starts = batch.query_start_loc.tolist()
    block_size, group = batch.k_cache.shape[1], batch.q.shape[1] // batch.k_cache.shape[2]
    for s, seq_len in enumerate(batch.seq_lens.tolist()):
        lo, hi = starts[s], starts[s + 1]
        pos = torch.arange(seq_len)
        blocks = batch.block_tables[s, pos // block_size].long()
        k = batch.k_cache[blocks, pos % block_size].repeat_interleave(group, 1)  # [n, Hq, D]
        v = batch.v_cache[blocks, pos % block_size].repeat_interleave(group, 1)
        q = batch.q[lo:hi]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        scores = torch.tanh(scores / CAP) * CAP
        q_pos = torch.arange(seq_len - (hi - lo), seq_len)
        visible = pos[None, :] <= q_pos[:, None]
        if window:
            visible &= pos[None, :] > q_pos[:, None] - window
        scores = scores.masked_fill(~visible, float("-inf"))
        out[lo:hi] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v)
    return out


@pytest.mark.parametrize("window", [0, 5])
def test_reference_caps_as_transformers_does(window: int) -> None:
    batch = _batch(PREFILL, seed=1)
    rest = (batch.max_query_len, batch.max_seq_len)
    got = reference.paged_attention(*_args(batch), *rest, sliding_window=window, softcap=CAP)
    expected = _eager(batch, window)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    uncapped = reference.paged_attention(*_args(batch), *rest, sliding_window=window)
    assert rel_err(uncapped, expected) > 0.05  # the cap matters for these scores
    decode = _batch(DECODE, seed=2)
    args = (*_args(decode)[:5], _args(decode)[6], decode.max_seq_len)
    got = reference.paged_decode_attention(*args, sliding_window=window, softcap=CAP)
    torch.testing.assert_close(got, _eager(decode, window), rtol=1e-5, atol=1e-5)
    # one stream takes the unmasked shortcut
    first = (decode.q[:1], *args[1:3], decode.block_tables[:1], decode.seq_lens[:1], *args[5:])
    one = reference.paged_decode_attention(*first, softcap=CAP)
    torch.testing.assert_close(one, _eager(decode, 0)[:1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window", [0, 5])
def test_prefill_kernels_cap_as_the_reference(window: int, device: str) -> None:
    """The all-paged kernel and the extend kernel (new keys from the qkv rows; the decode row
    through the decode kernel as decode_prefix)."""
    batch = _batch([(21, 1), (0, 13), (9, 7)], seed=3, device=device)
    rest = (batch.max_query_len, batch.max_seq_len)
    expected = reference.paged_attention(*_args(batch), *rest, sliding_window=window, softcap=CAP)
    paged = paged_attention_triton(*_args(batch), *rest, sliding_window=window, softcap=CAP)
    assert rel_err(paged, expected) < 1e-5
    new_kv = fused_new_kv(batch)
    prefix = torch.tensor([1], dtype=torch.int32, device=device)
    extend = extend_attention_triton(
        *_args(batch)[:3], new_kv, *_args(batch)[3:], batch.max_seq_len, prefix,
        sliding_window=window, softcap=CAP, tma=False,
    )  # fmt: skip
    assert rel_err(extend, expected) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_kernels_cap_as_the_reference(splits: int, device: str) -> None:
    batch = _batch(DECODE, seed=4, device=device)
    args = (*_args(batch)[:5], _args(batch)[6], batch.max_seq_len)
    expected = reference.paged_decode_attention(*args, sliding_window=9, softcap=CAP)
    got = paged_decode_attention_triton(*args, sliding_window=9, softcap=CAP, num_splits=splits)
    assert rel_err(got, expected) < 1e-5
    fp8, k_scale, v_scale = fp8_batch(DECODE, device, seed=5)
    fp8.q.mul_(64.0)
    scales = {"k_scale": k_scale, "v_scale": v_scale}
    args = (*_args(fp8)[:5], _args(fp8)[6], fp8.max_seq_len)
    expected = reference.paged_decode_attention(*args, softcap=CAP, **scales)
    assert rel_err(reference.paged_decode_attention(*args, **scales), expected) > 0.05
    got = paged_decode_attention_triton(*args, softcap=CAP, num_splits=splits, **scales)
    # the kernel rounds q to fp16 for the fp8 dot; CUDA's q and output are bf16
    assert rel_err(got, expected) < (1e-3 if device == "cpu" else 1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_cap_gemma2_heads() -> None:
    """bf16 on CUDA at Gemma 2 2B's heads (8 q, 4 kv, head_dim 256), cap 50 with scores past
    it: the extend kernel (TMA rows; the Hopper prefill steps aside), the all-paged kernel and
    the split decode kernel against the fp32 reference."""
    lens = [(0, 300), (517, 64), (1000, 1)]
    batch = make_paged_batch(
        lens, num_q_heads=8, num_kv_heads=4, head_dim=256, block_size=16, dtype=torch.bfloat16,
        device="cuda", seed=6,
    )  # fmt: skip
    batch.q.mul_(16.0)
    scale, rest = 256**-0.5, (batch.max_query_len, batch.max_seq_len)
    f32 = (batch.q.float(), batch.k_cache.float(), batch.v_cache.float(), *_args(batch)[3:6])
    expected = reference.paged_attention(*f32, scale, *rest, softcap=50.0)
    assert rel_err(reference.paged_attention(*f32, scale, *rest), expected) > 0.05
    paged = paged_attention_triton(*_args(batch)[:6], scale, *rest, softcap=50.0)
    assert rel_err(paged, expected) < 1e-2
    extend = extend_attention_triton(
        *_args(batch)[:3], fused_new_kv(batch), *_args(batch)[3:6], scale, batch.max_seq_len,
        softcap=50.0,
    )  # fmt: skip
    assert rel_err(extend, expected) < 1e-2
    decode = batch.q[-1:], *_args(batch)[1:3], batch.block_tables[-1:], batch.seq_lens[-1:]
    got = paged_decode_attention_triton(*decode, scale, batch.max_seq_len, softcap=50.0)
    assert rel_err(got, expected[-1:]) < 1e-2
