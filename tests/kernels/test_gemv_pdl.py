"""The decode GEMVs with programmatic dependent launch (config.pdl, kernels/gemv_pdl.py).

On the CPU (TRITON_INTERPRET=1) pdl runs the PEEL form (no griddepcontrol ops: the interpreter
has none); it must give the very numbers of pdl off. On a GPU (sm_90+) the kernels launch with
PDL: a chain of dependent GEMVs (y1 = W1 x, y2 = W2 y1, ...), eagerly and replayed in a CUDA
graph with new x each replay, must match the torch reference step by step (a kernel that read
its x before the previous one finished would read a stale or unwritten buffer; a split-K
counter left non-zero would merge too early on the next replay). The sm_90 PTX itself
(weights before the wait, x and stores after) is ops/gemv_pdl_check.py's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from fp8_weights import fp8_weight
from int4_weights import int4_weight
from troupe.kernels.gemv_pdl import GDC, OFF, PEEL, pdl_mode
from troupe.kernels.quant_fp8 import Fp8Cols, Fp8ColsGemv, fp8_cols_matmul, fp8_cols_reference
from troupe.kernels.quant_int4 import (
    Int4Cols,
    Int4ColsGemv,
    int4_cols_matmul,
    int4_cols_reference,
)

BOUND = 1e-2  # the fp16 lanes of the GEMVs' PTX (kernels/half2_ptx.py)
GemvConfig = Int4ColsGemv | Fp8ColsGemv
Cols = Int4Cols | Fp8Cols


def test_pdl_mode() -> None:
    assert pdl_mode(False, torch.device("cpu")) == OFF
    assert pdl_mode(True, torch.device("cpu")) == PEEL


@pytest.mark.parametrize(
    ("config", "n", "k"),
    [
        (Int4ColsGemv(groups=2), 40, 256),  # 8 groups: two splits of the peel + 1 tile
        (Int4ColsGemv(groups=8), 8, 256),  # the peel alone
        (Int4ColsGemv(groups=2), 8, 96),  # a tile past K
    ],
)
def test_int4_pdl_cpu(config: Int4ColsGemv, n: int, k: int) -> None:
    cols = Int4Cols.from_rows(*int4_weight(n, k, 32, "cpu", seed=n + k))
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(n))
    got = int4_cols_matmul(x, cols, replace(config, pdl=True))
    off = int4_cols_matmul(x, cols, replace(config, pdl=False))
    want = int4_cols_reference(x, cols)
    assert torch.equal(got, off)
    assert (got - want).abs().max() <= BOUND * want.abs().max()
    assert want.abs().max() > 0.1


@pytest.mark.parametrize(
    ("config", "n", "k", "scale_shape"),
    [
        (Fp8ColsGemv(blocks=2), 10, 128, (10, 1)),  # per channel; two splits of the peel + 1
        (Fp8ColsGemv(blocks=8), 8, 128, (8, 2)),  # block scales; the peel alone
        (Fp8ColsGemv(blocks=4), 12, 384, (1, 3)),  # 128 x 128 blocks
    ],
)
def test_fp8_pdl_cpu(config: Fp8ColsGemv, n: int, k: int, scale_shape: tuple[int, int]) -> None:
    cols = Fp8Cols.from_rows(*fp8_weight(n, k, scale_shape, "cpu"))
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(n))
    got = fp8_cols_matmul(x, cols, replace(config, pdl=True))
    off = fp8_cols_matmul(x, cols, replace(config, pdl=False))
    want = fp8_cols_reference(x, cols)
    assert torch.equal(got, off)
    assert (got - want).abs().max() <= BOUND * want.abs().max()
    assert want.abs().max() > 0.1


# --- GPU: chains of dependent GEMVs ---------------------------------------------------------

DIM, LAYERS = 4096, 6


def _int4_chain(device: str) -> list[Cols]:
    """Square int4 weights whose y keeps x's scale (w ~ 1/sqrt(DIM) per element)."""
    out: list[Cols] = []
    for i in range(LAYERS):
        gen = torch.Generator().manual_seed(100 + i)
        packed = torch.randint(0, 256, (DIM, DIM // 2), generator=gen, dtype=torch.uint8)
        scale = (torch.rand(DIM, DIM // 32, generator=gen) + 0.5) / (4.6 * DIM**0.5)
        bias = -8 * scale
        cols = Int4Cols.from_rows(packed, scale, bias)
        out.append(Int4Cols(cols.words.to(device), cols.scale.to(device), cols.bias.to(device)))
    return out


def _fp8_chain(device: str) -> list[Cols]:
    out: list[Cols] = []
    for i in range(LAYERS):
        weight, _ = fp8_weight(DIM + i, DIM, (1, 1), "cpu")
        weight = weight[:DIM]
        scale = 1 / (weight.float().std(dim=1, keepdim=True) * DIM**0.5)
        cols = Fp8Cols.from_rows(weight, scale)
        out.append(Fp8Cols(cols.words.to(device), cols.scale.to(device)))
    return out


def _step(config: GemvConfig) -> Callable[[torch.Tensor, Cols], torch.Tensor]:
    def step(x: torch.Tensor, w: Cols) -> torch.Tensor:
        if isinstance(config, Int4ColsGemv):
            assert isinstance(w, Int4Cols)
            return int4_cols_matmul(x, w, config)
        assert isinstance(w, Fp8Cols)
        return fp8_cols_matmul(x, w, config)

    return step


def _reference(x: torch.Tensor, w: Cols) -> torch.Tensor:
    if isinstance(w, Int4Cols):
        return int4_cols_reference(x.float(), w)
    return fp8_cols_reference(x.float(), w)


def _check_chain(x: torch.Tensor, ys: list[torch.Tensor], chain: list[Cols]) -> None:
    """Each y against the reference of the GEMV on the kernel's own input."""
    inputs = [x, *ys[:-1]]
    for i, (xi, yi, w) in enumerate(zip(inputs, ys, chain, strict=True)):
        want = _reference(xi, w).float()
        err = (yi.float() - want).abs().max() / want.abs().max()
        assert err <= BOUND, f"layer {i}: error {err:.2e}"
        assert want.abs().max() > 0.1


# at DIM 4096: 128 int4 groups, 256 fp8 blocks of 16 a row
GPU_CONFIGS: list[GemvConfig] = [
    Int4ColsGemv(),  # the engine's int4: K split 4 ways, the last split sums
    Int4ColsGemv(groups=8, waves=1),  # one split: the peel + 15 tiles
    Int4ColsGemv(block_n=256, groups=8, num_warps=4, waves=8),  # many splits
    Fp8ColsGemv(),  # the engine's fp8
    Fp8ColsGemv(blocks=16, waves=1),  # one split
]


def _id(c: GemvConfig) -> str:
    return f"{type(c).__name__[:4]}-n{c.block_n}-g{c.groups if isinstance(c, Int4ColsGemv) else c.blocks}-w{c.waves}"


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_CONFIGS, ids=_id)
def test_pdl_chain_gpu(config: GemvConfig) -> None:
    """The chain with pdl on and off, eager and in a CUDA graph, against the reference."""
    device = torch.device("cuda")
    if pdl_mode(True, device) != GDC:
        pytest.skip("PDL needs compute capability 9.0")
    chain = _int4_chain("cuda") if isinstance(config, Int4ColsGemv) else _fp8_chain("cuda")
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
