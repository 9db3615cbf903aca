"""The native CPU int8 kernel (Q8_0 weights, gpu/cpu_q8.py) against fp64 references from the
same codes, its layout's round trips, and Int8Linear's choice between it and fbgemm."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import troupe.gpu.cpu_q4lib as q4lib_module
from troupe.gpu.cpu_q4 import CpuQ4, expands
from troupe.gpu.cpu_q4lib import Q4Lib
from troupe.gpu.cpu_q8 import CpuQ8
from troupe.gpu.gguf_quant import Q4_1, Q4_K, Q6_K, Q8_0, Int4Blocks, Int8Blocks, from_gguf
from troupe.gpu.quant_linear import Int8Linear, embedding

from tests.gpu.test_cpu_q4 import _quantized
from tests.gpu.test_gguf_quant import random_blocks


def _blocks(n: int, k: int, seed: int, kind: int = Q8_0) -> Int8Blocks:
    raw = random_blocks(kind, n, k, seed=seed)
    if kind == Q8_0:
        raw.reshape(n, k // 32, 34)[0, 0, 2:] = 0x80  # a group of -128 codes
    blocks = from_gguf(raw, kind, (n, k))
    assert isinstance(blocks, Int8Blocks)
    return blocks


def _errors(out: torch.Tensor, blocks: Int8Blocks, x: torch.Tensor) -> tuple[float, float]:
    """max |out - reference| / tolerance, against the same 8-bit activations and against the
    exact product (the activation rounding's bound), both fp64."""
    xq, d = _quantized(x)
    n, k = blocks.shape
    isum = torch.einsum("ngk,mgk->mng", blocks.codes.view(n, -1, 32).double(), xq.double())
    terms = blocks.scale.double() * d.double()[:, None, :] * isum
    tight = (k // 32 + 4) * 2.0**-24 * terms.abs().sum(-1) + 1e-30
    w = blocks.dequantize().double()
    bound = torch.einsum("ng,mg->mn", w.abs().view(n, -1, 32).sum(-1), d.double()) * 0.5001
    out = out.double()
    return (
        float(((out - terms.sum(-1)).abs() / tight).max()),
        float(((out - x.double() @ w.T).abs() / (bound + tight)).max()),
    )


@pytest.mark.parametrize(("n", "k", "m"), [(64, 64, 1), (100, 96, 3), (200, 512, 6)])
def test_kernel_matches_references(q4lib: Any, n: int, k: int, m: int) -> None:
    blocks = _blocks(n, k, seed=n + m)
    x = torch.randn(m, k) * 2
    tight, exact = _errors(CpuQ8(blocks, q4lib)(x), blocks, x)
    assert tight <= 1 and exact <= 1
    wrong = Int8Blocks(blocks.codes, (blocks.scale * (1 + 2.0**-6)).half().float(), 32)
    assert _errors(CpuQ8(wrong, q4lib)(x), blocks, x)[0] > 10


def test_layout_round_trips_and_embedding(q4lib: Any) -> None:
    blocks = _blocks(100, 96, seed=2)
    layer = Int8Linear(blocks, q4lib)
    assert layer.native is not None
    assert torch.equal(layer.blocks.codes, blocks.codes)
    assert torch.equal(layer.blocks.scale, blocks.scale)
    ids = torch.tensor([5, 0, 99, 5, 16])
    assert torch.equal(embedding(ids, layer, torch.float32), blocks.dequantize()[ids])
    x = torch.randn(257, 96)  # above NATIVE_MAX_ROWS: the exact weight where 4-bit ones expand
    want = x @ blocks.dequantize().T if expands(257) else layer.native.rows(x)
    assert torch.equal(layer(x), want)


def test_q6_k_and_no_kernel_take_fbgemm(q4lib: Any) -> None:
    assert Int8Linear(_blocks(32, 256, seed=4, kind=Q6_K), q4lib).native is None  # groups of 16
    assert Int8Linear(_blocks(32, 64, seed=4), None).native is None


def test_thread_split_is_bit_identical(q4lib: Any) -> None:
    layer = CpuQ8(_blocks(200, 256, seed=6), q4lib)
    x = torch.randn(5, 256)
    try:
        q4lib.set_threads(1)
        one = layer(x)
        q4lib.set_threads(2)
        two = layer(x)
    finally:
        q4lib.set_threads(2)
    assert torch.equal(one, two)


def test_the_avx2_build_gives_the_same_bits(q4lib: Any, tmp_path: Path) -> None:
    """A build with AVX-512 off takes gpu/cpu_q4dot_avx2.h's path (on an AVX-512 VNNI CPU the
    fixture's build takes the other one): the same bits for each weight form, at one row (a
    decode's split) and at five (tiles of 4 and 1), with a part-full last tile."""
    compiler = shutil.which("gcc")
    assert compiler is not None  # the fixture built with it
    flags = q4lib_module.cpu_flags()
    avx2 = Q4Lib(q4lib_module._build(compiler, tmp_path, flags, ("-mno-avx512f",)), 2)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(0))
    q8 = _blocks(40, 256, seed=4)  # with a group of -128 codes
    for rows in (x[:1], x):
        assert torch.equal(CpuQ8(q8, avx2)(rows), CpuQ8(q8, q4lib)(rows))
        for kind in (Q4_1, Q4_K):  # fp16 and fp32 factors
            q4 = from_gguf(random_blocks(kind, 40, 256, seed=5), kind, (40, 256))
            assert isinstance(q4, Int4Blocks)
            assert torch.equal(CpuQ4(q4, avx2)(rows), CpuQ4(q4, q4lib)(rows))
