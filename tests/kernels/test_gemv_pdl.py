"""The decode GEMVs with programmatic dependent launch (config.pdl, kernels/gemv_pdl.py).

On the CPU (TRITON_INTERPRET=1) pdl runs the PEEL form: the first tile peeled off the loop,
no griddepcontrol ops (the interpreter has none); it must give the very numbers of pdl off.
On a GPU (sm_90+) the kernels launch with PDL: a chain of dependent GEMVs (y1 = W1 x, y2 =
W2 y1, ...), eagerly and replayed in a CUDA graph with new x each replay, must match the
torch reference step by step (a kernel that read its x before the previous one finished
would read a stale or unwritten buffer). The sm_90 PTX itself (weights before the wait, x
and stores after) is ops/gemv_pdl_check.py's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from fp8_weights import fp8_weight
from int4_weights import int4_weight
from troupe.kernels.gemv_pdl import GDC, OFF, PEEL, pdl_mode
from troupe.kernels.quant_gemv import (
    INT4_GEMV,
    fp8_matmul,
    fp8_reference,
    int4_matmul,
    int4_reference,
)
from troupe.kernels.quant_gemv_config import Fp8Gemv, Fp8GemvConfig, Int4Gemv, Int4GemvConfig

BOUND = 1e-2  # the half2 GEMVs' fp16 lanes (tests/kernels/test_quant_half2.py)
GemvConfig = Int4GemvConfig | Fp8GemvConfig


def test_pdl_mode() -> None:
    assert pdl_mode(False, torch.device("cpu")) == OFF
    assert pdl_mode(True, torch.device("cpu")) == PEEL


@pytest.mark.parametrize(
    ("config", "m", "n", "k"),
    [
        (Int4GemvConfig(Int4Gemv.HALF2, 4, 2, pdl=True), 1, 10, 256),  # peel + 3 tiles
        (Int4GemvConfig(Int4Gemv.HALF2, 4, 2, pdl=True), 2, 8, 64),  # the peel alone
        (Int4GemvConfig(Int4Gemv.HALF2, 2, 2, k_splits=2, pdl=True), 1, 6, 256),  # 2 splits
        (Int4GemvConfig(Int4Gemv.HALF2, 4, 2, pdl=True), 1, 8, 96),  # a tile past K
        (Int4GemvConfig(Int4Gemv.BYTES, pdl=True), 1, 40, 768),  # 3 tiles of 256
    ],
)
def test_int4_pdl_cpu(config: Int4GemvConfig, m: int, n: int, k: int) -> None:
    packed, scale, bias = int4_weight(n, k, 32, "cpu", seed=n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    got = int4_matmul(x, packed, scale, bias, 32, config)
    off = int4_matmul(x, packed, scale, bias, 32, replace(config, pdl=False))
    want = int4_reference(x, packed, scale, bias, 32)
    assert torch.equal(got, off)
    assert (got - want).abs().max() <= BOUND * want.abs().max()
    assert want.abs().max() > 0.1


@pytest.mark.parametrize(
    ("config", "m", "n", "k", "scale_shape"),
    [
        (Fp8GemvConfig(Fp8Gemv.HALF2, 4, 8, pdl=True), 1, 10, 128, (10, 1)),  # per channel
        (Fp8GemvConfig(Fp8Gemv.HALF2, 4, 8, pdl=True), 2, 8, 128, (8, 2)),  # block scales
        (Fp8GemvConfig(Fp8Gemv.HALF2, 4, 8, k_splits=2, pdl=True), 1, 9, 256, (9, 1)),
        (Fp8GemvConfig(Fp8Gemv.BYTES, pdl=True), 1, 20, 1536, (20, 1)),  # 3 tiles of 512
        (Fp8GemvConfig(Fp8Gemv.BYTES, pdl=True), 1, 12, 384, (1, 3)),  # 128 x 128 blocks
    ],
)
def test_fp8_pdl_cpu(
    config: Fp8GemvConfig, m: int, n: int, k: int, scale_shape: tuple[int, int]
) -> None:
    weight, scale = fp8_weight(n, k, scale_shape, "cpu")
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    got = fp8_matmul(x, weight, scale, config)
    off = fp8_matmul(x, weight, scale, replace(config, pdl=False))
    want = fp8_reference(x, weight, scale)
    assert torch.equal(got, off)
    assert (got - want).abs().max() <= BOUND * want.abs().max()
    assert want.abs().max() > 0.1


# --- GPU: chains of dependent GEMVs ---------------------------------------------------------

DIM, LAYERS = 4096, 6


def _int4_chain(device: str) -> list[tuple[torch.Tensor, ...]]:
    """Square int4 weights whose y keeps x's scale (w ~ 1/sqrt(DIM) per element)."""
    out = []
    for i in range(LAYERS):
        gen = torch.Generator().manual_seed(100 + i)
        packed = torch.randint(0, 256, (DIM, DIM // 2), generator=gen, dtype=torch.uint8)
        scale = (torch.rand(DIM, DIM // 32, generator=gen) + 0.5) / (4.6 * DIM**0.5)
        bias = -8 * scale
        out.append((packed.to(device), scale.to(device, torch.float16), bias.to(device).half()))
    return out


def _fp8_chain(device: str) -> list[tuple[torch.Tensor, ...]]:
    out = []
    for i in range(LAYERS):
        weight, _ = fp8_weight(DIM + i, DIM, (1, 1), "cpu")
        weight = weight[:DIM]
        q = weight.float()
        scale = 1 / (q.std(dim=1, keepdim=True) * DIM**0.5)
        out.append((weight.to(device), scale.to(device)))
    return out


def _step(config: GemvConfig) -> Callable[[torch.Tensor, tuple[torch.Tensor, ...]], torch.Tensor]:
    if isinstance(config, Int4GemvConfig):
        return lambda x, w: int4_matmul(x, w[0], w[1], w[2], 32, config)
    return lambda x, w: fp8_matmul(x, w[0], w[1], config)


def _reference(x: torch.Tensor, w: tuple[torch.Tensor, ...]) -> torch.Tensor:
    if len(w) == 3:
        return int4_reference(x.float(), w[0], w[1], w[2], 32)
    return fp8_reference(x.float(), w[0], w[1])


def _check_chain(
    x: torch.Tensor, ys: list[torch.Tensor], chain: list[tuple[torch.Tensor, ...]]
) -> None:
    """Each y against the reference of the GEMV on the kernel's own input."""
    inputs = [x, *ys[:-1]]
    for i, (xi, yi, w) in enumerate(zip(inputs, ys, chain, strict=True)):
        want = _reference(xi, w).float()
        err = (yi.float() - want).abs().max() / want.abs().max()
        assert err <= BOUND, f"layer {i}: error {err:.2e}"
        assert want.abs().max() > 0.1


# at DIM 4096: 128 int4 groups, 1024 fp8 words a row
GPU_CONFIGS = [
    replace(INT4_GEMV, pdl=True),  # the engine's int4 (half2, K splits chosen): the peel alone
    Int4GemvConfig(Int4Gemv.HALF2, 4, 32, k_splits=1, pdl=True),  # the peel + 3 tiles
    Int4GemvConfig(Int4Gemv.HALF2, 4, 32, k_splits=2, pdl=True),  # 2 splits: a torch sum after
    Int4GemvConfig(Int4Gemv.BYTES, pdl=True),  # 4 splits of 4 tiles
    Fp8GemvConfig(Fp8Gemv.BYTES, pdl=True),  # 8 tiles
    Fp8GemvConfig(Fp8Gemv.HALF2, 4, 128, k_splits=0, pdl=True),  # 8 tiles, K splits chosen
    Fp8GemvConfig(Fp8Gemv.HALF2, 4, 512, k_splits=1, pdl=True),  # the peel + 1 tile
]


def _id(c: GemvConfig) -> str:
    tile = c.groups if isinstance(c, Int4GemvConfig) else c.block_w
    return f"{type(c).__name__[:4]}-{c.variant.value}-n{c.block_n}-t{tile}-k{c.k_splits}"


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_CONFIGS, ids=_id)
def test_pdl_chain_gpu(config: GemvConfig) -> None:
    """The chain with pdl on and off, eager and in a CUDA graph, against the reference."""
    device = torch.device("cuda")
    if pdl_mode(True, device) != GDC:
        pytest.skip("PDL needs compute capability 9.0")
    chain = _int4_chain("cuda") if isinstance(config, Int4GemvConfig) else _fp8_chain("cuda")
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(1, DIM, generator=gen).to(device, torch.bfloat16) for _ in range(4)]
    finals = {}
    for pdl in (True, False):
        step = _step(replace(config, pdl=pdl))

        def run(x: torch.Tensor, step=step) -> list[torch.Tensor]:
            ys = []
            for w in chain:
                x = step(x, w)
                ys.append(x)
            return ys

        ys = run(xs[0])
        _check_chain(xs[0], ys, chain)
        finals[pdl] = ys[-1].float()
        # the graph: replays with new x must see each step's new input
        static_x = xs[0].clone()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            run(static_x)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_ys = run(static_x)
        for x in xs[1:]:
            static_x.copy_(x)
            graph.replay()
            torch.cuda.synchronize()
            _check_chain(x, [y.clone() for y in static_ys], chain)
    diff = (finals[True] - finals[False]).abs().max() / finals[False].abs().max()
    assert diff <= 2 * BOUND  # rounding apart (fma contraction in the peel), the same sums
