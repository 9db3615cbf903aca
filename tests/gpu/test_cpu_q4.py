"""The native CPU int4 kernel (gpu/cpu_q4dot.c via gpu/cpu_q4.py) against fp64 references built
from the same codes: tight against the same 8-bit activation rounding, within that rounding's
bound against the exact product; thread split, odd shapes, the layout's round trips, fallback."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import troupe.gpu.cpu_q4 as cpu_q4_module
import troupe.gpu.cpu_q4lib as q4lib_module
from troupe.gpu.cpu_int4 import CpuInt4, expand_bf16
from troupe.gpu.cpu_q4 import NATIVE_MAX_ROWS, CpuQ4
from troupe.gpu.cpu_q4lib import Q4Options, load_q4, long_prefill_dtype
from troupe.gpu.gguf_quant import Q4_1, Q4_K, Int4Blocks, from_gguf
from troupe.gpu.quant_linear import Int4Linear

from tests.gpu.test_gguf_quant import random_blocks

CPU = torch.device("cpu")


def _blocks(n: int, k: int, seed: int, kind: int = Q4_1) -> Int4Blocks:
    blocks = from_gguf(random_blocks(kind, n, k, seed=seed), kind, (n, k))
    assert isinstance(blocks, Int4Blocks)
    return blocks


def _quantized(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(xq [M, G, 32], d [M, G]) as the kernel rounds them (fp32, half to even)."""
    groups = x.view(x.shape[0], -1, 32)
    d = groups.abs().amax(-1) / 127
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return torch.round(groups * inverse[..., None]), d


def _errors(out: torch.Tensor, blocks: Int4Blocks, x: torch.Tensor) -> tuple[float, float]:
    """max |out - reference| / tolerance against (the same 8-bit activations, fp64) and
    against (the exact product, fp64, the activation rounding's bound)."""
    xq, d = _quantized(x)
    n, k = blocks.shape
    q = blocks.codes().view(n, -1, 32).double()
    isum = torch.einsum("ngk,mgk->mng", q, xq.double())  # exact integers
    s, b = blocks.scale.double(), blocks.bias.double()
    dx, sx = d.double(), (d * xq.sum(-1)).double()
    terms = s * dx[:, None, :] * isum, b * sx[:, None, :]
    same = (terms[0] + terms[1]).sum(-1)
    size = (terms[0].abs() + terms[1].abs()).sum(-1)
    tight = (k // 32 + 4) * 2.0**-24 * size + 1e-30
    w = blocks.dequantize().double()
    exact = x.double() @ w.T
    bound = torch.einsum("ng,mg->mn", w.abs().view(n, -1, 32).sum(-1), dx) * 0.5 * (1 + 1e-4)
    out = out.double()
    return float(((out - same).abs() / tight).max()), float(
        ((out - exact).abs() / (bound + tight)).max()
    )


@pytest.mark.parametrize(("n", "k", "m"), [(64, 64, 1), (100, 96, 3), (48, 32, 5), (200, 512, 17)])
def test_kernel_matches_references(q4lib: Any, n: int, k: int, m: int) -> None:
    blocks = _blocks(n, k, seed=n + k + m)
    x = torch.randn(m, k) * 3
    x[0, :32] = 0  # an all-zero group: d = 0
    tight, exact = _errors(CpuQ4(blocks, q4lib)(x), blocks, x)
    assert tight <= 1 and exact <= 1


def test_factors_not_exact_in_fp16_are_kept_in_fp32(q4lib: Any) -> None:
    blocks = _blocks(32, 256, seed=3, kind=Q4_K)
    layer = CpuQ4(blocks, q4lib)
    assert layer.factors.dtype == torch.float32  # Q4_K's d * sc is not an fp16 in general
    x = torch.randn(2, 256)
    assert max(_errors(layer(x), blocks, x)) <= 1


@pytest.mark.parametrize("fault", ["nibbles", "scale", "bias"])
def test_a_wrong_weight_fails_the_check(q4lib: Any, fault: str) -> None:
    blocks = _blocks(64, 128, seed=7)
    p, s, b = blocks.packed, blocks.scale, blocks.bias
    if fault == "nibbles":
        p = (p >> 4) | (p << 4)
    elif fault == "scale":
        s = s * (1 + 2.0**-8)
    else:
        b = b + b.abs() * 2.0**-8
    x = torch.randn(2, 128)
    tight, _ = _errors(CpuQ4(Int4Blocks(p, s, b, 32), q4lib)(x), blocks, x)
    assert tight > 10


def test_thread_split_is_bit_identical(q4lib: Any) -> None:
    blocks = _blocks(200, 512, seed=11)  # 13 tiles: an odd split, the last tile part-full
    layer = CpuQ4(blocks, q4lib)
    x = torch.randn(7, 512)
    try:
        assert q4lib.set_threads(1) == 1
        one = layer(x)
        assert q4lib.set_threads(2) == 2
        two = layer(x)
    finally:
        q4lib.set_threads(2)
    assert torch.equal(one, two)


def test_one_row_calls_leave_a_core_to_the_engine(q4lib: Any) -> None:
    count = torch.get_num_threads()
    try:
        assert q4lib.set_threads(0) == count and q4lib.one_row_threads == max(1, count - 1)
        assert q4lib.set_threads(3) == 3 and q4lib.one_row_threads == 3  # asked: both
    finally:
        q4lib.set_threads(2)


def test_layout_round_trips(q4lib: Any) -> None:
    blocks = _blocks(100, 96, seed=5)
    layer = CpuQ4(blocks, q4lib)
    back = layer.blocks()
    assert torch.equal(back.packed, blocks.packed)
    assert torch.equal(back.scale, blocks.scale) and torch.equal(back.bias, blocks.bias)
    rows = torch.tensor([0, 17, 99, 3])
    some = layer.blocks(rows)
    assert torch.equal(some.packed, blocks.packed[rows])
    assert torch.equal(some.scale, blocks.scale[rows])
    assert torch.equal(some.bias, blocks.bias[rows])
    assert torch.equal(layer.expand(), expand_bf16(blocks))
    assert torch.equal(layer.expand(torch.float32), blocks.dequantize())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_long_inputs_expand_only_on_a_bf16_cpu(
    q4lib: Any, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above NATIVE_MAX_ROWS rows a CPU that multiplies bf16 natively expands the weight into one
    bf16 GEMM; one without keeps the kernel (its int8 dot products beat an fp32 GEMM there)."""
    monkeypatch.setattr(cpu_q4_module, "long_prefill_dtype", lambda: dtype)
    blocks = _blocks(64, 64, seed=9)
    layer = CpuQ4(blocks, q4lib)
    x = torch.randn(NATIVE_MAX_ROWS + 1, 64)
    assert cpu_q4_module.expands(NATIVE_MAX_ROWS + 1) == (dtype == torch.bfloat16)
    assert not cpu_q4_module.expands(NATIVE_MAX_ROWS)
    if dtype == torch.bfloat16:
        want = torch.nn.functional.linear(x.bfloat16(), blocks.dequantize().bfloat16()).float()
    else:
        want = layer.rows(x)
        assert _errors(want, blocks, x)[0] <= 1
    assert torch.equal(layer(x), want)


def test_long_prefill_dtype_follows_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    for flags, dtype in [({"avx2"}, torch.float32), ({"avx512_bf16"}, torch.bfloat16)]:
        long_prefill_dtype.cache_clear()
        monkeypatch.setattr(q4lib_module, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert long_prefill_dtype() == dtype
    long_prefill_dtype.cache_clear()


def test_int4_linear_picks_the_kernel_or_torch(q4lib: Any) -> None:
    blocks = _blocks(64, 64, seed=1)
    assert isinstance(Int4Linear(blocks, CPU, q4lib).cpu_int4, CpuQ4)
    assert isinstance(Int4Linear(blocks, CPU, None).cpu_int4, CpuInt4)


def test_fallback_when_off_or_unsupported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert load_q4(Q4Options(enabled=False)) is None
    caplog.set_level(logging.INFO, logger=q4lib_module.__name__)
    monkeypatch.setattr(q4lib_module, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert load_q4(Q4Options(cache_dir=str(tmp_path))) is None
    assert "lacks avx512bw/avx512vl/avx512_vnni/f16c and fma/f16c" in caplog.text
    monkeypatch.setattr(q4lib_module, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    monkeypatch.setattr(q4lib_module.shutil, "which", lambda _: None)
    assert load_q4(Q4Options(cache_dir=str(tmp_path))) is None
    assert "no gcc" in caplog.text
    assert not list(tmp_path.iterdir())


def test_build_is_cached_by_source_and_flags(q4lib: Any) -> None:
    again = load_q4(Q4Options(cache_dir=str(q4lib.path.parent), threads=2))
    assert again is q4lib  # same hash: the built file is reused, not rebuilt
    assert len(list(q4lib.path.parent.glob("*.so"))) == 1


def test_engine_config_fields_reach_the_options() -> None:
    from troupe.config import ConfigError, EngineConfig

    config = EngineConfig(cpu_native_kernels=False, cpu_kernel_cache_dir="/x", cpu_kernel_threads=3)
    assert Q4Options.from_config(config) == Q4Options(enabled=False, cache_dir="/x", threads=3)
    with pytest.raises(ConfigError, match="cpu_kernel_threads"):
        EngineConfig(cpu_kernel_threads=-1)
