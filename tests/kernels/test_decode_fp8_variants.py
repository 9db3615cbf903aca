"""The fp8-KV decode variants (kernels/decode_attention_fp8.py) against the torch reference.

CPU: Triton under TRITON_INTERPRET=1, fp32 q; GPU (-m gpu): bf16, real head sizes.
The fp16 variants round q and the probabilities to fp16: against a reference fed the same
fp16-rounded q only the probabilities' rounding is left (about 1e-4 here).
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl
from fp8_batch import fp8_batch, rel_err
from troupe.kernels import decode_attention, reference
from troupe.kernels.decode_attention import DecodeConfig, paged_decode_attention_triton
from troupe.kernels.decode_attention_fp8 import Fp8Variant, kernel_constexprs
from troupe.kernels.fp8_tile import to_f16
from troupe.kernels.kv_quant import FP8_DTYPE, quantize
from troupe.kernels.paged_batch import make_paged_batch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", list(Fp8Variant))
def test_fp8_variant_matches_reference(device: str, variant: Fp8Variant) -> None:
    lens = [(n - 1, 1) for n in ([1, 22, 13] if device == "cpu" else [1, 500, 3000, 17])]
    batch, k_scale, v_scale = fp8_batch(lens, device, seed=11, cpu_q_heads=8)
    q16 = batch.q if variant is Fp8Variant.BF16_DOT else batch.q.half().to(batch.q.dtype)
    args = (batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
            batch.max_seq_len)  # fmt: skip
    bound = 1e-2 if device == "cuda" else (1e-6 if variant is Fp8Variant.BF16_DOT else 1e-3)
    config = DecodeConfig(fp8=variant)
    for num_splits, window in ((1, 0), (3, 7)):
        ref = reference.paged_decode_attention(
            q16, *args, k_scale=k_scale, v_scale=v_scale, sliding_window=window
        )
        out = paged_decode_attention_triton(
            batch.q, *args, num_splits=num_splits, config=config, sliding_window=window,
            k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip
        assert rel_err(out, ref) < bound, (variant, num_splits, window)
    # the scales are applied: the same bytes read as if unscaled are far off
    plain = reference.paged_decode_attention(
        batch.q, batch.k_cache.float(), batch.v_cache.float(), batch.block_tables,
        batch.seq_lens, 0.25, batch.max_seq_len,
    )  # fmt: skip
    assert rel_err(plain, ref) > 0.5


def test_fp8_variant_skips_rows_past_num_valid() -> None:
    batch, k_scale, v_scale = fp8_batch([(8, 1), (20, 1), (3, 1)], "cpu", seed=12, cpu_q_heads=8)
    out = torch.full_like(batch.q, float("nan"))
    paged_decode_attention_triton(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
        batch.max_seq_len, num_splits=2, config=DecodeConfig(fp8=Fp8Variant.F16_BITS_PREFETCH),
        out=out, num_valid=torch.tensor([2], dtype=torch.int32), k_scale=k_scale,
        v_scale=v_scale,
    )  # fmt: skip
    assert not out[:2].isnan().any()
    assert out[2].isnan().all()  # left alone


def test_word_variants_fall_back_for_head_dims_off_16_bytes() -> None:
    """head_dim 24: rows are not 16-byte aligned, so a word variant runs F16_CAST (same bytes
    out) instead of misreading; direct kernel_constexprs callers get a clear error."""
    batch = make_paged_batch(
        [(9, 1), (30, 1)], num_q_heads=4, num_kv_heads=2, head_dim=24, block_size=4,
        dtype=torch.float32, device="cpu", seed=14,
    )  # fmt: skip
    scales = torch.tensor([1 / 64, 1 / 32])
    k8 = quantize(batch.k_cache.flatten(0, 1), scales).view(batch.k_cache.shape)
    v8 = quantize(batch.v_cache.flatten(0, 1), scales).view(batch.v_cache.shape)
    args = (batch.q, k8, v8, batch.block_tables, batch.seq_lens, 0.25, batch.max_seq_len)
    outs = [
        paged_decode_attention_triton(
            *args, config=DecodeConfig(fp8=variant), k_scale=scales, v_scale=scales
        )
        for variant in (Fp8Variant.WORD_CVT_ROWS, Fp8Variant.F16_CAST)
    ]
    assert torch.equal(outs[0], outs[1])
    ref = reference.paged_decode_attention(
        batch.q.half().float(), k8, v8, *args[3:], k_scale=scales, v_scale=scales
    )
    assert rel_err(outs[0], ref) < 1e-3
    with pytest.raises(ValueError, match="head_dim=24"):
        kernel_constexprs(
            Fp8Variant.WORD_BITS, num_q_heads=4, num_kv_heads=2, head_dim=24, block_size=4,
            num_splits=1, has_limit=False, block_n=16,
        )  # fmt: skip


@triton.jit
def _convert_kernel(x_ptr, out_ptr, MODE: tl.constexpr, ASM: tl.constexpr):
    if MODE >= 4:  # as 64 rows of one 32-bit word: bytes 4r..4r+3 of row r
        rows = tl.arange(0, 64)
        words = tl.load(x_ptr.to(tl.pointer_type(tl.uint32)) + rows[:, None])
        tile = to_f16(words, rows < 64, MODE, ASM, 64, 4)
        tl.store(out_ptr + rows[:, None] * 4 + tl.arange(0, 4)[None, :], tile)
    else:  # 16 rows of 16 bytes
        rows = tl.arange(0, 16)
        offs = rows[:, None] * 16 + tl.arange(0, 16)[None, :]
        tl.store(out_ptr + offs, to_f16(tl.load(x_ptr + offs), rows < 16, MODE, ASM, 16, 16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [1, 2, 3, 4, 5])
def test_every_e4m3_byte_converts_exactly(device: str, mode: int) -> None:
    """All 256 bytes (subnormals, zeros, both signs; NaN bytes 0x7F/0xFF excepted), in order
    (the word modes put byte i of a word at column i). Mode 5 runs its inline PTX on the GPU
    (exact values) and mode 4's integer ops under the interpreter (value * 2^-8)."""
    x = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE).to(device)
    out = torch.empty(256, dtype=torch.float16, device=device)
    asm = device == "cuda"
    _convert_kernel[(1,)](x, out, MODE=mode, ASM=asm)
    exact = mode in (1, 3) or (mode == 5 and asm)
    expected = x.float().cpu() * (1.0 if exact else 2.0**-8)
    finite = ~expected.isnan()
    assert int(finite.sum()) == 254
    assert torch.equal(out.float().cpu()[finite], expected[finite])
    assert math.copysign(1.0, float(out[0x80])) == -1.0  # -0 keeps its sign


def test_engine_default_is_the_fp8_constant(monkeypatch: pytest.MonkeyPatch) -> None:
    """config=None (the engine path) takes FP8_DEFAULT_CONFIG for an fp8 cache, read at call
    time: flipping that one constant switches the variant."""
    batch, k_scale, v_scale = fp8_batch([(12, 1), (5, 1)], "cpu", seed=13, cpu_q_heads=8)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
            batch.max_seq_len)  # fmt: skip
    scales = {"k_scale": k_scale, "v_scale": v_scale}
    cast = DecodeConfig(fp8=Fp8Variant.F16_CAST)
    monkeypatch.setattr(decode_attention, "FP8_DEFAULT_CONFIG", cast)
    engine = paged_decode_attention_triton(*args, **scales)
    assert torch.equal(engine, paged_decode_attention_triton(*args, config=cast, **scales))
    bf16_dot = DecodeConfig(fp8=Fp8Variant.BF16_DOT)
    assert not torch.equal(engine, paged_decode_attention_triton(*args, config=bf16_dot, **scales))
