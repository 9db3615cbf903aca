"""The column-layout int4 matmuls (kernels/quant_int4.py) against their torch reference and
the row layout's: the decode GEMV (K split, columns and groups past the ends) and the GEMM."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from int4_weights import int4_weight
from troupe.gpu.gguf_quant import Int4Blocks
from troupe.kernels.arrival import arrival_counters, split_buffers
from troupe.kernels.int4_dp4a import x_int8_reference
from troupe.kernels.quant_int4 import (
    INT4_COLS_GEMV,
    Int4Cols,
    Int4ColsGemv,
    gemv_launch,
    int4_cols_gemv,
    int4_cols_matmul,
    int4_cols_reference,
    split_compiled,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def test_column_layout_round_trips() -> None:
    packed, scale, bias = int4_weight(24, 128, 32, "cpu", seed=1)
    cols = Int4Cols.from_rows(packed, scale, bias)
    assert cols.shape == (24, 128) and cols.words.shape == (16, 24)
    back, s, b = cols.rows()
    assert torch.equal(back, packed)
    assert torch.equal(s, scale.half()) and torch.equal(b, bias.half())
    index = torch.tensor([3, 0, 17])
    sub, _, _ = cols.rows(index)
    assert torch.equal(sub, packed[index])


def _case(
    device: str, m: int, n: int, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Int4Cols, torch.Tensor]:
    """A random int4 weight [N, K] (its row form on the CPU, its columns on `device`) and x
    [M, K] (bf16 on CUDA); N and K 16 times larger on CUDA."""
    if device == "cuda":
        n, k = n * 16, k * 16
    packed, scale, bias = int4_weight(n, k, 32, "cpu", seed=m + n + k)
    cols = Int4Cols.from_rows(packed, scale, bias)
    cols = Int4Cols(cols.words.to(device), cols.scale.to(device), cols.bias.to(device))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(device)
    if device == "cuda":
        x = x.to(torch.bfloat16)
    return packed, scale, bias, cols, x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("m", "n", "k", "gemv"),
    [
        (1, 256, 128, Int4ColsGemv(groups=2)),  # K split in two (the CPU's), summed by the last
        (1, 200, 160, Int4ColsGemv(block_n=256, groups=2)),  # columns past N; 5 groups: the
        # last split runs past K
        (1, 384, 256, Int4ColsGemv(block_n=128, groups=4, pdl=False)),
        (1, 128, 2048, None),  # the engine's launch (64 groups: two splits on the CPU)
        (1, 256, 256, None),  # on CUDA Llama's o (4,096 x 4,096): 32 columns over all of K
        (1, 200, 256, Int4ColsGemv(groups=2, whole_k_groups=8)),  # the same on the CPU, N ragged
        (2, 256, 128, Int4ColsGemv(groups=2, max_rows=4)),  # rows a program (the multi-row GEMV)
        (3, 200, 160, Int4ColsGemv(block_n=256, groups=2, max_rows=4)),  # + columns past N
        (4, 128, 2048, Int4ColsGemv(groups=8, max_rows=4)),
        (3, 128, 2048, None),  # the engine's launch at 3 rows (quant_int4.INT4_ROWS_GEMV)
        (4, 96, 320, None),  # the GEMM with K split (a skinny batch)
        (17, 72, 192, None),
        (40, 64, 128, None),
    ],
)
def test_int4_cols_matmul(device: str, m: int, n: int, k: int, gemv: Int4ColsGemv | None) -> None:
    packed, scale, bias, cols, x = _case(device, m, n, k)
    got = int4_cols_matmul(x, cols, gemv).float()
    assert not arrival_counters(1, x.device)[:64].any()  # the last split set its count back
    want = int4_cols_reference(x.float(), cols).float()
    dense = Int4Blocks(packed, scale.half().float(), bias.half().float(), 32).dequantize()
    rows = x.float().cpu() @ dense.T  # the file's layout, expanded by the loader's own code
    assert torch.allclose(want.cpu(), rows, rtol=1e-5, atol=1e-4)  # the layouts agree
    bound = 1e-4 if device == "cpu" else 1e-2
    assert (got - want).abs().max() <= bound * want.abs().max()
    assert want.abs().max() > 0.1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("m", "n", "k", "gemv"),
    [
        (1, 256, 128, Int4ColsGemv(groups=2, x_int8=True)),  # K split in two
        (1, 200, 160, Int4ColsGemv(block_n=256, groups=2, x_int8=True)),  # past N and K
        (1, 200, 256, Int4ColsGemv(groups=2, whole_k_groups=8, x_int8=True)),  # whole K
        (1, 128, 2048, replace(INT4_COLS_GEMV, x_int8=True)),  # the engine's launch
        (3, 200, 160, Int4ColsGemv(block_n=256, groups=2, max_rows=4, x_int8=True)),  # rows
    ],
)
def test_the_integer_form_is_the_matmul_of_x_rounded_to_int8(
    device: str, m: int, n: int, k: int, gemv: Int4ColsGemv
) -> None:
    """Int4ColsGemv.x_int8 (kernels/int4_dp4a.py): the codes times x rounded per group to int8,
    the biases times the exact sums of x, up to fp32 sums (and bf16 output on CUDA); ~1% of
    max |y| from the unrounded x."""
    _, _, _, cols, x = _case(device, m, n, k)
    got = int4_cols_matmul(x, cols, gemv).float()
    rounded = x_int8_reference(x)
    assert not torch.equal(rounded, x.float())

    def bias_term(v: torch.Tensor) -> torch.Tensor:  # the kernel takes sum(x) unrounded
        return v.float().reshape(m, -1, 32).sum(-1) @ cols.bias.float()

    want = int4_cols_reference(rounded, cols).float() - bias_term(rounded) + bias_term(x)
    bound = 1e-5 if device == "cpu" else 5e-3
    assert (got - want).abs().max() <= bound * want.abs().max()
    exact = int4_cols_reference(x.float(), cols).float()
    assert 1e-4 * exact.abs().max() < (got - exact).abs().max() < 2e-2 * exact.abs().max()


def test_the_gemv_halves_its_columns_only_where_k_is_split() -> None:
    cpu = torch.device("cpu")  # k_splits on the CPU: two splits wherever two chunks exist
    config = Int4ColsGemv(whole_k_groups=0)
    launch = gemv_launch(1, 4096, 128, config, cpu)  # K = 4,096: 4 chunks of 32 groups
    assert launch == (64, 32, 64, 2, 64)  # more programs, the same splits
    assert gemv_launch(1, 4096, 32, config, cpu) == (128, 32, 32, 1, 32)  # no split: kept wide
    narrow = Int4ColsGemv(block_n=64, whole_k_groups=0)
    assert gemv_launch(1, 4096, 128, narrow, cpu).block_n == 64  # an explicit narrow one stays


def test_the_gemv_takes_the_whole_of_k_where_it_would_split_a_short_k() -> None:
    cpu = torch.device("cpu")
    config = Int4ColsGemv()  # the engine's: whole_k_groups 128
    assert gemv_launch(1, 4096, 128, config, cpu) == (32, 128, 128, 1, 128)  # K = 4,096
    assert gemv_launch(1, 6144, 96, config, cpu) == (32, 128, 192, 1, 96)  # groups a power of 2
    assert gemv_launch(1, 4096, 448, config, cpu).block_n == 64  # K = 14,336: split, halved
    assert gemv_launch(1, 4096, 32, config, cpu).block_n == 128  # no split: kept wide
    assert gemv_launch(1, 4096, 128, config, cpu, rows=3).split == 2  # several rows: as before


def test_one_compiled_kernel_serves_the_split_and_unsplit_launches() -> None:
    """gate_up (one split) and down (split) launch the kernel compiled SPLIT on, so a launch
    at one split gets int32 counters (the atomics are compiled in; bf16 fails to compile)."""
    cpu = torch.device("cpu")
    assert split_compiled(gemv_launch(1, 4096, 32, INT4_COLS_GEMV, cpu))  # one split, wide
    assert split_compiled(gemv_launch(1, 4096, 448, INT4_COLS_GEMV, cpu))  # split
    assert not split_compiled(gemv_launch(1, 4096, 128, INT4_COLS_GEMV, cpu))  # whole K
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    out, part, counters = split_buffers(1, 1, 256, 2, x)
    assert counters.dtype == torch.int32 and part.numel() == 0 and out.dtype == x.dtype


@pytest.mark.parametrize(("m", "rows"), [(5, 2), (7, 3), (2, 4)])
def test_the_gemv_takes_its_rows_in_groups(m: int, rows: int) -> None:
    """Programs of `rows` rows each, the last group partial (its missing rows never stored);
    every arrival counter set back."""
    packed, scale, bias = int4_weight(136, 256, 32, "cpu", seed=m)
    cols = Int4Cols.from_rows(packed, scale, bias)
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(rows))
    got = int4_cols_gemv(x, cols, Int4ColsGemv(groups=2, max_rows=rows))
    want = int4_cols_reference(x, cols)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert not arrival_counters(1, x.device)[:256].any()
