"""fp8 (e4m3) KV cache: the kernels' quantized writes and fp8 reads against the reference, the
reference's rounding against torch's e4m3 cast, and the per-head scales set at the first write.

CPU: Triton under TRITON_INTERPRET=1 (its fp8 casts round as torch does); GPU: -m gpu.
"""

from __future__ import annotations

import math

import pytest
import torch
from fp8_batch import fp8_batch, rel_err
from troupe.kernels import reference
from troupe.kernels.decode_attention import paged_decode_attention_triton
from troupe.kernels.kv_quant import FP8_DTYPE, FP8_MAX, HEADROOM, quantize, update_kv_scales
from troupe.kernels.kv_scales import update_kv_scales_triton
from troupe.kernels.kv_write import write_kv_triton
from troupe.kernels.paged_attention import paged_attention_triton
from troupe.kernels.qkv_prepare import prepare_qkv_triton
from troupe.kernels.rope_cache import build_cos_sin_cache

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def test_quantize_is_torchs_e4m3_cast_and_saturates() -> None:
    x = torch.tensor([[[0.3, -1.7, 1000.0, -1e9]]])
    scale = torch.tensor([0.5])
    got = quantize(x, scale)
    assert got.dtype == FP8_DTYPE
    expected = torch.tensor([0.6, -3.4, FP8_MAX, -FP8_MAX]).to(FP8_DTYPE)
    assert torch.equal(got.view(torch.uint8), expected.view(1, 1, 4).view(torch.uint8))


def test_scales_are_set_once_from_the_first_write() -> None:
    heads, dim = 2, 8
    qkv = torch.randn(5, (3 + 2 * heads) * dim)
    k_scale, v_scale = torch.zeros(heads), torch.zeros(heads)
    update_kv_scales(qkv, None, 1e-6, heads, dim, k_scale, v_scale)
    k = qkv[:, 3 * dim : 3 * dim + heads * dim].reshape(5, heads, dim)
    v = qkv[:, -heads * dim :].reshape(5, heads, dim)
    pair = torch.sqrt(k[..., : dim // 2] ** 2 + k[..., dim // 2 :] ** 2).amax(dim=(0, 2))
    torch.testing.assert_close(k_scale, pair * HEADROOM / FP8_MAX)
    torch.testing.assert_close(v_scale, v.abs().amax(dim=(0, 2)) * HEADROOM / FP8_MAX)
    first = k_scale.clone()
    update_kv_scales(qkv * 100, None, 1e-6, heads, dim, k_scale, v_scale)
    assert torch.equal(k_scale, first)  # set scales never move: stored blocks stay valid


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("tokens", "normed"), [(70, True), (5, False)])
def test_scales_kernel_matches_the_torch_form(device: str, tokens: int, normed: bool) -> None:
    """The GPU's one-kernel form: unset scales get the torch form's value (within an ulp: the
    rsqrt differs), a set one is left alone, and a second batch moves none."""
    heads, dim = 3, 16
    gen = torch.Generator().manual_seed(6)
    spread = torch.linspace(0.5, 3.0, (4 + 2 * heads) * dim)  # heads of different ranges
    qkv = (torch.randn(tokens, (4 + 2 * heads) * dim, generator=gen) * spread).to(device)
    norm = (1 + 0.1 * torch.randn(dim, generator=gen)).to(device) if normed else None
    want = [torch.zeros(heads, device=device) for _ in range(2)]
    got = [torch.zeros(heads, device=device) for _ in range(2)]
    for scales in (want, got):
        scales[0][1] = 0.5  # set before: kept
    update_kv_scales(qkv, norm, 1e-6, heads, dim, *want)
    update_kv_scales_triton(qkv, norm, 1e-6, heads, dim, *got)
    for ours, ref in zip(got, want, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=0)
    assert float(got[0][1]) == 0.5 and bool((got[1] > 0).all())
    first = [s.clone() for s in got]
    update_kv_scales_triton(qkv * 100, norm, 1e-6, heads, dim, *got)
    assert all(torch.equal(a, b) for a, b in zip(got, first, strict=True))


@pytest.mark.parametrize("device", DEVICES)
def test_write_kv_fp8_matches_reference(device: str) -> None:
    gen = torch.Generator().manual_seed(3)
    key, value = (torch.randn(9, 2, 16, generator=gen).to(device) * 3 for _ in range(2))
    k_scale = torch.tensor([0.01, 0.02], device=device)
    v_scale = torch.tensor([0.03, 0.005], device=device)
    slots = torch.tensor([5, 0, -1, 7, 2, 11, 3, 9, 1], device=device)
    caches = [torch.zeros(3, 4, 2, 16, device=device).to(FP8_DTYPE) for _ in range(4)]
    write_kv_triton(key, value, caches[0], caches[1], slots, k_scale=k_scale, v_scale=v_scale)
    reference.write_kv(key, value, caches[2], caches[3], slots, k_scale=k_scale, v_scale=v_scale)
    assert torch.equal(caches[0].view(torch.uint8), caches[2].view(torch.uint8))
    assert torch.equal(caches[1].view(torch.uint8), caches[3].view(torch.uint8))
    assert caches[0].view(torch.uint8).any()  # something was written


@pytest.mark.parametrize("device", DEVICES)
def test_prepare_qkv_fp8_matches_reference(device: str) -> None:
    heads, dim, num_q = 2, 16, 4
    gen = torch.Generator().manual_seed(4)
    qkv = torch.randn(7, (num_q + 2 * heads) * dim, generator=gen).to(device)
    norm = (1 + 0.1 * torch.randn(dim, generator=gen)).to(device)
    cos_sin = build_cos_sin_cache(dim, 64, 1e4, None, torch.float32, device)
    positions = torch.tensor([0, 5, 9, 3, 17, 30, 2], device=device)
    slots = torch.tensor([4, 1, 6, -1, 0, 11, 8], device=device)
    k_scale, v_scale = torch.zeros(heads, device=device), torch.zeros(heads, device=device)
    update_kv_scales(qkv, norm, 1e-6, heads, dim, k_scale, v_scale)
    caches = [torch.zeros(3, 4, heads, dim, device=device).to(FP8_DTYPE) for _ in range(4)]
    args = (qkv, norm, norm, 1e-6, positions, cos_sin)
    q1 = prepare_qkv_triton(*args, caches[0], caches[1], slots, k_scale=k_scale, v_scale=v_scale)
    q2 = reference.prepare_qkv(*args, caches[2], caches[3], slots, k_scale=k_scale, v_scale=v_scale)
    torch.testing.assert_close(q1, q2, rtol=1e-5, atol=1e-5)
    for ours, ref, scale in ((caches[0], caches[2], k_scale), (caches[1], caches[3], v_scale)):
        # k is rotated in fp32 by both; an e4m3 step apart at most where a value sits on a tie
        diff = (ours.float() - ref.float()).abs() * scale[:, None]
        assert float(diff.max()) <= float(scale.max()) * 32  # one step at the top binade
        assert float((ours.float() != ref.float()).float().mean()) < 0.01
        assert ours.float().abs().max() <= FP8_MAX / HEADROOM * 1.01  # bound held, no clamp


@pytest.mark.parametrize("device", DEVICES)
def test_paged_attention_reads_fp8(device: str) -> None:
    lens = [(0, 9), (13, 1), (5, 7), (30, 1)]
    if device == "cuda":
        lens = [(16 * c, n if n == 1 else 16 * n) for c, n in lens]
    batch, k_scale, v_scale = fp8_batch(lens, device, seed=8)
    scale = 1 / math.sqrt(batch.q.shape[-1])
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, scale, batch.max_query_len, batch.max_seq_len)  # fmt: skip
    ref = reference.paged_attention(*args, k_scale=k_scale, v_scale=v_scale)
    out = paged_attention_triton(*args, k_scale=k_scale, v_scale=v_scale)
    bound = 1e-4 if device == "cpu" else 1e-2
    assert rel_err(out, ref) < bound
    # the decodes through the decode kernel (mixed steps), windowed too
    for window in (0, 5):
        ref_w = reference.paged_attention(
            *args, k_scale=k_scale, v_scale=v_scale, sliding_window=window
        )
        out_w = paged_attention_triton(
            *args, sliding_window=window, k_scale=k_scale, v_scale=v_scale
        )
        assert rel_err(out_w, ref_w) < bound


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_reads_fp8(device: str, num_splits: int) -> None:
    lens = [(n - 1, 1) for n in ([1, 9, 30, 17] if device == "cpu" else [1, 500, 3000, 17])]
    batch, k_scale, v_scale = fp8_batch(lens, device, seed=9)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
            batch.max_seq_len)  # fmt: skip
    ref = reference.paged_decode_attention(*args, k_scale=k_scale, v_scale=v_scale)
    out = paged_decode_attention_triton(
        *args, num_splits=num_splits, k_scale=k_scale, v_scale=v_scale
    )
    # the fp8 default (F16_CAST) multiplies in fp16: q and the probabilities round to 11 bits
    assert rel_err(out, ref) < (1e-3 if device == "cpu" else 1e-2)
    # fp8 is not a no-op: reading the same bytes without the scales is far off
    plain = reference.paged_decode_attention(
        batch.q, batch.k_cache.float(), batch.v_cache.float(), batch.block_tables,
        batch.seq_lens, 0.25, batch.max_seq_len,
    )  # fmt: skip
    assert rel_err(plain, ref) > 0.5
