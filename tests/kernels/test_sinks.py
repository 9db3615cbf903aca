"""GPT-OSS's learned attention sinks (kernels/sinks.py) in every attention op: the torch
reference against transformers' eager formula written out (the sink a last score column,
dropped after the softmax), and the Triton decode (each variant, split and not), fp8 decode,
paged (each variant) and extend kernels (fp32 under TRITON_INTERPRET=1) against the reference,
windowed too. The sinks sit among the scores, so leaving them out changes the outputs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from fp8_batch import fp8_batch, rel_err
from troupe.kernels import reference
from troupe.kernels.decode_attention import (
    DEFAULT_CONFIG,
    DecodeVariant,
    paged_decode_attention_triton,
)
from troupe.kernels.extend_attention import extend_attention_triton
from troupe.kernels.paged_attention import PrefillConfig, PrefillVariant, paged_attention_triton
from troupe.kernels.paged_batch import PagedBatch, fused_new_kv, make_paged_batch

SINKS = [1.5, -2.0, 3.0, 0.25]  # one per query head
PREFILL = [(0, 13), (9, 7), (21, 1)]  # (cached prefix, new tokens): a prompt, a chunk, a decode
DECODE = [(20, 1), (6, 1), (37, 1)]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]  # fp32 on both


def _batch(lens: list[tuple[int, int]], seed: int, device: str = "cpu") -> PagedBatch:
    return make_paged_batch(
        lens, num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.float32,
        device=device, seed=seed,
    )  # fmt: skip


def _sinks(device: str = "cpu") -> torch.Tensor:
    return torch.tensor(SINKS, device=device)


def _args(batch: PagedBatch) -> tuple:
    return (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, 1 / math.sqrt(batch.q.shape[2]))  # fmt: skip


def _decode_args(batch: PagedBatch) -> tuple:
    return (*_args(batch)[:5], _args(batch)[6], batch.max_seq_len)


def _eager(batch: PagedBatch, window: int) -> torch.Tensor:
    """transformers' GPT-OSS eager attention, one sequence at a time, keys gathered in order."""
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
        scores = torch.einsum("qhd,khd->hqk", batch.q[lo:hi], k) * scale
        q_pos = torch.arange(seq_len - (hi - lo), seq_len)
        visible = pos[None, :] <= q_pos[:, None]
        if window:
            visible &= pos[None, :] > q_pos[:, None] - window
        scores = scores.masked_fill(~visible, float("-inf"))
        sinks = _sinks().reshape(-1, 1, 1).expand(-1, hi - lo, 1)
        combined = torch.cat([scores, sinks], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1)[..., :-1]
        out[lo:hi] = torch.einsum("hqk,khd->qhd", probs, v)
    return out


@pytest.mark.parametrize("window", [0, 5])
def test_reference_sinks_as_transformers_does(window: int) -> None:
    batch = _batch(PREFILL, seed=1)
    rest = (batch.max_query_len, batch.max_seq_len)
    sinks = _sinks()
    got = reference.paged_attention(*_args(batch), *rest, sliding_window=window, sinks=sinks)
    expected = _eager(batch, window)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    plain = reference.paged_attention(*_args(batch), *rest, sliding_window=window)
    assert rel_err(plain, expected) > 0.05  # the sinks matter for these scores
    decode = _batch(DECODE, seed=2)
    args = _decode_args(decode)
    got = reference.paged_decode_attention(*args, sliding_window=window, sinks=sinks)
    torch.testing.assert_close(got, _eager(decode, window), rtol=1e-5, atol=1e-5)
    # one stream takes the unmasked shortcut
    first = (decode.q[:1], *args[1:3], decode.block_tables[:1], decode.seq_lens[:1], *args[5:])
    one = reference.paged_decode_attention(*first, sinks=sinks)
    torch.testing.assert_close(one, _eager(decode, 0)[:1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window", [0, 5])
def test_prefill_kernels_sink_as_the_reference(window: int, device: str) -> None:
    """The all-paged kernel in each variant and the extend kernel (new keys from the qkv rows;
    the decode row through the decode kernel as decode_prefix)."""
    batch = _batch([(21, 1), (0, 13), (9, 7)], seed=3, device=device)
    rest = (batch.max_query_len, batch.max_seq_len)
    sinks = _sinks(device)
    expected = reference.paged_attention(*_args(batch), *rest, sliding_window=window, sinks=sinks)
    for variant in (PrefillVariant.BASE, PrefillVariant.PAGED, PrefillVariant.LAZY):
        paged = paged_attention_triton(
            *_args(batch), *rest, sliding_window=window, sinks=sinks,
            config=PrefillConfig(variant=variant),
        )  # fmt: skip
        assert rel_err(paged, expected) < 1e-5, variant
    prefix = torch.tensor([1], dtype=torch.int32, device=device)
    extend = extend_attention_triton(
        *_args(batch)[:3], fused_new_kv(batch), *_args(batch)[3:], batch.max_seq_len, prefix,
        sliding_window=window, sinks=sinks, tma=False,
    )  # fmt: skip
    assert rel_err(extend, expected) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_kernels_sink_as_the_reference(splits: int, device: str) -> None:
    """Each decode variant counts the sink once however many splits merge; the fp8 kernel too."""
    batch = _batch(DECODE, seed=4, device=device)
    args, sinks = _decode_args(batch), _sinks(device)
    expected = reference.paged_decode_attention(*args, sliding_window=9, sinks=sinks)
    for variant in DecodeVariant:
        got = paged_decode_attention_triton(
            *args, sliding_window=9, sinks=sinks, num_splits=splits,
            config=dataclasses.replace(DEFAULT_CONFIG, variant=variant),
        )  # fmt: skip
        assert rel_err(got, expected) < 1e-5, variant
    fp8, k_scale, v_scale = fp8_batch(DECODE, device, seed=5)
    scales = {"k_scale": k_scale, "v_scale": v_scale}
    args, sinks = _decode_args(fp8), torch.linspace(-2.0, 3.0, fp8.q.shape[1], device=device)
    expected = reference.paged_decode_attention(*args, sinks=sinks, **scales)
    assert rel_err(reference.paged_decode_attention(*args, **scales), expected) > 0.05
    got = paged_decode_attention_triton(*args, sinks=sinks, num_splits=splits, **scales)
    # the kernel rounds q to fp16 for the fp8 dot; CUDA's q and output are bf16
    assert rel_err(got, expected) < (1e-3 if device == "cpu" else 1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_sink_gpt_oss_heads() -> None:
    """bf16 on CUDA at GPT-OSS 20B's heads (64 q, 8 kv, head_dim 64), unwindowed and with its
    local layers' 128-token window: the extend kernel (TMA rows), the all-paged kernel and the
    split decode kernel against the fp32 reference."""
    lens = [(0, 300), (517, 64), (1000, 1)]
    batch = make_paged_batch(
        lens, num_q_heads=64, num_kv_heads=8, head_dim=64, block_size=16, dtype=torch.bfloat16,
        device="cuda", seed=6,
    )  # fmt: skip
    sinks = torch.linspace(-3.0, 4.0, 64, device="cuda")
    scale, rest = 64**-0.5, (batch.max_query_len, batch.max_seq_len)
    f32 = (batch.q.float(), batch.k_cache.float(), batch.v_cache.float(), *_args(batch)[3:6])
    for window in (0, 128):
        expected = reference.paged_attention(*f32, scale, *rest, sliding_window=window, sinks=sinks)
        plain = reference.paged_attention(*f32, scale, *rest, sliding_window=window)
        assert rel_err(plain, expected) > 0.05
        paged = paged_attention_triton(
            *_args(batch)[:6], scale, *rest, sliding_window=window, sinks=sinks
        )
        assert rel_err(paged, expected) < 1e-2
        extend = extend_attention_triton(
            *_args(batch)[:3], fused_new_kv(batch), *_args(batch)[3:6], scale,
            batch.max_seq_len, sliding_window=window, sinks=sinks,
        )  # fmt: skip
        assert rel_err(extend, expected) < 1e-2
        decode = batch.q[-1:], *_args(batch)[1:3], batch.block_tables[-1:], batch.seq_lens[-1:]
        got = paged_decode_attention_triton(
            *decode, scale, batch.max_seq_len, sliding_window=window, sinks=sinks
        )
        assert rel_err(got, expected[-1:]) < 1e-2
