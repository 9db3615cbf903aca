"""The CPU int4 layout built from GGUF codes (gpu/cpu_int4.py) is torch's own, and both the
packed decode path and the bf16 prefill path stay within their documented rounding of the
exact (gguf-py) weight."""

from __future__ import annotations

import pytest
import torch
from troupe.gpu.cpu_int4 import (
    CPU_PACKED_MAX_ROWS,
    CpuInt4,
    expand_bf16,
    pack_int4_for_cpu,
    unpack_int4_for_cpu,
)
from troupe.gpu.cpu_q4lib import long_prefill_dtype
from troupe.gpu.gguf_quant import Q4_0, Q4_1, Q4_K, from_gguf

from tests.gpu.test_gguf_quant import random_blocks


@pytest.mark.parametrize("ggml_type", [Q4_1, Q4_K])
@pytest.mark.parametrize("n", [64, 192, 40, 96])  # 40, 96: not whole blocks of 64 rows
def test_pack_is_torchs_layout(ggml_type: int, n: int) -> None:
    k = 512
    blocks = from_gguf(random_blocks(ggml_type, n, k, seed=n), ggml_type, (n, k))
    codes = torch.nn.functional.pad(blocks.codes().to(torch.int32), (0, 0, 0, -n % 16))
    want = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    assert torch.equal(pack_int4_for_cpu(blocks), want)


@pytest.mark.parametrize("ggml_type", [Q4_0, Q4_1, Q4_K])
@pytest.mark.parametrize("n", [64, 192, 40])  # 40: torch's padded form keeps the nibbles
def test_exact_blocks_come_back_from_the_packed_copy(ggml_type: int, n: int) -> None:
    k = 256
    blocks = from_gguf(random_blocks(ggml_type, n, k, seed=n + 1), ggml_type, (n, k))
    cpu = CpuInt4(blocks)
    # factors held in fp16 where the file's fp16 fields give them exactly (Q4_0: -8 d too)
    held = torch.float32 if ggml_type == Q4_K else torch.float16
    assert cpu._scale.dtype == cpu._bias.dtype == held
    assert torch.equal(cpu.scale, blocks.scale) and torch.equal(cpu.bias, blocks.bias)
    if n % 64 == 0:
        assert torch.equal(unpack_int4_for_cpu(cpu.packed, k), blocks.codes())
    assert torch.equal(cpu.blocks().packed, blocks.packed)
    rows = torch.tensor([n - 1, 0, 33, 5, 33])
    assert torch.equal(cpu.blocks(rows).dequantize(), blocks.dequantize()[rows])
    assert torch.equal(cpu.expand(), blocks.dequantize().to(torch.bfloat16))
    assert torch.equal(cpu.expand(chunk_rows=64), cpu.expand())  # 1-3 chunks
    assert torch.equal(cpu.expand(torch.float32), blocks.dequantize())


@pytest.mark.parametrize("ggml_type", [Q4_0, Q4_1, Q4_K])
@pytest.mark.parametrize("rows", [1, 7, CPU_PACKED_MAX_ROWS + 9])
def test_decode_and_prefill_paths_match_the_exact_weight(ggml_type: int, rows: int) -> None:
    n, k = 128, 512
    blocks = from_gguf(random_blocks(ggml_type, n, k, seed=3), ggml_type, (n, k))
    exact = blocks.dequantize()
    assert torch.equal(expand_bf16(blocks), exact.to(torch.bfloat16))
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    want = x @ exact.T
    got = CpuInt4(blocks)(x)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    # bf16 activations (and factors, or the weight): a few bf16 ulps of the output's magnitude;
    # a long prefill on a CPU without native bf16 runs in fp32 (long_prefill_dtype)
    error = (got - want).abs().max()
    assert error <= 0.02 * want.abs().max()
    assert error > 0 or (rows > CPU_PACKED_MAX_ROWS and long_prefill_dtype() == torch.float32)
