"""GGUF blocks kept as shipped (gpu/gguf_quant.py) expand exactly as gguf-py's dequantize, and
the quantized linear layers (gpu/quant_linear.py) match the expanded weight."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from troupe.gpu.cpu_q4lib import long_prefill_dtype
from troupe.gpu.gguf_quant import BLOCK_BYTES, Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, concat_rows, from_gguf
from troupe.gpu.int8_rows import per_row_int8
from troupe.gpu.quant_linear import CPU_PACKED_MAX_ROWS, Int4Linear, Int8Linear, embedding, linear

# byte offsets of the fp16 fields in each block (random bytes there could be NaN or inf)
_HALF_FIELDS = {Q4_0: (0,), Q4_1: (0, 2), Q8_0: (0,), Q4_K: (0, 2), Q6_K: (208,)}


def random_blocks(ggml_type: int, n: int, k: int, seed: int) -> np.ndarray:
    """Random raw bytes of an [n, k] tensor with finite, small fp16 scales."""
    block, size = BLOCK_BYTES[ggml_type]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    for offset in _HALF_FIELDS[ggml_type]:
        half = (rng.standard_normal((n, k // block)) * 0.01).astype(np.float16)
        raw[..., offset : offset + 2] = half.view(np.uint8).reshape(n, k // block, 2)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("ggml_type", [Q4_0, Q4_1, Q8_0, Q4_K, Q6_K])
def test_expansion_is_bit_identical_to_gguf(ggml_type: int) -> None:
    n, k = 24, 512
    raw = random_blocks(ggml_type, n, k, seed=ggml_type)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(ggml_type)).reshape(n, k)
    got = from_gguf(raw, ggml_type, (n, k)).dequantize().numpy()
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    np.testing.assert_array_equal(got, want)


def test_rows_and_concat_keep_each_row() -> None:
    a = from_gguf(random_blocks(Q4_1, 8, 64, 1), Q4_1, (8, 64))
    b = from_gguf(random_blocks(Q4_1, 4, 64, 2), Q4_1, (4, 64))
    order = torch.tensor([3, 0, 2, 1, 7, 6, 5, 4])
    fused = concat_rows([a.rows(order), b])
    want = torch.cat((a.dequantize()[order], b.dequantize()))
    assert torch.equal(fused.dequantize(), want)
    with pytest.raises(ValueError, match="fuse"):
        concat_rows([a, from_gguf(random_blocks(Q8_0, 4, 64, 3), Q8_0, (4, 64))])


@pytest.mark.parametrize("ggml_type", [Q4_0, Q4_1, Q4_K])
@pytest.mark.parametrize("rows", [1, 3, CPU_PACKED_MAX_ROWS + 5])
@pytest.mark.parametrize("n", [96, 40])  # 40: padded to the packed format's 16 rows
def test_int4_linear_matches_the_expanded_weight(ggml_type: int, rows: int, n: int) -> None:
    k = 512
    blocks = from_gguf(random_blocks(ggml_type, n, k, seed=7), ggml_type, (n, k))
    layer = Int4Linear(blocks, torch.device("cpu"))
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    want = x @ blocks.dequantize().T
    got = linear(x, layer)
    # bf16 activations, and scales and zeros (decode) or the weight (prefill, > 16 rows): a
    # few bf16 ulps of the row's magnitude
    scale = want.abs().max()
    assert (got - want).abs().max() <= 0.02 * scale
    if rows <= CPU_PACKED_MAX_ROWS or long_prefill_dtype() == torch.bfloat16:
        assert (got - want).abs().max() > 0  # a bf16 path ran (a long one is fp32 on AVX2)


@pytest.mark.parametrize("ggml_type", [Q8_0, Q6_K])
def test_int8_linear_and_embedding(ggml_type: int) -> None:
    n, k = 80, 256
    blocks = from_gguf(random_blocks(ggml_type, n, k, seed=11), ggml_type, (n, k))
    layer = Int8Linear(blocks)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(0))
    want = x @ blocks.dequantize().T
    got = linear(x, layer, bias=torch.ones(n))
    assert (got - 1 - want).abs().max() <= 0.03 * want.abs().max()
    ids = torch.tensor([5, 0, 79, 5])
    assert torch.equal(embedding(ids, layer, torch.float32), blocks.dequantize()[ids])


@pytest.mark.parametrize("ggml_type", [Q8_0, Q6_K])
def test_per_row_int8_equals_requantising_the_expanded_weight(ggml_type: int) -> None:
    n, k = 4096 + 40, 256  # two slices, the second partial
    raw = random_blocks(ggml_type, n, k, seed=13)
    if ggml_type == Q8_0:  # code -128 in some rows (|-128| overflows int8), all zero in one
        raw.reshape(n, k // 32, 34)[:50, 3, 2] = 0x80
        raw.reshape(n, k // 32, 34)[7, :, 2:] = 0
    blocks = from_gguf(raw, ggml_type, (n, k))
    weight = blocks.dequantize()
    want_scale = weight.abs().amax(dim=1).clamp_min(1e-30) / 127
    want = torch.round(weight / want_scale[:, None]).clamp(-127, 127).to(torch.int8)
    codes, scale = per_row_int8(blocks)
    assert torch.equal(scale, want_scale)
    assert torch.equal(codes, want)
    assert (codes == -127).any() and (codes == 127).any()
