"""ops/fp8_vt_probe.py's kernel (values stored transposed within a page) under the interpreter:
the same attention as the torch reference over the usual fp8 cache, across splits, page sizes
and tiles of several pages, with keys masked past each sequence's end. (Zeroing the stale slots
of a last page, which on the GPU may hold an fp8 NaN, is not visible here: the interpreter reads
e4m3 0x7F as 480, not NaN.)"""

import math

import pytest
import torch
from troupe.kernels import reference
from troupe.kernels.kv_quant import quantize
from troupe.kernels.paged_batch import make_paged_batch
from troupe.ops.fp8_vt_probe import decode_vt, transposed_values


@pytest.mark.parametrize(("block_size", "block_n", "splits"), [(4, 16, 1), (4, 16, 3), (8, 32, 2)])
def test_transposed_values_give_the_reference(block_size: int, block_n: int, splits: int) -> None:
    batch = make_paged_batch([(37, 1), (5, 1), (60, 1)], num_q_heads=8, num_kv_heads=2,
                             head_dim=16, block_size=block_size, dtype=torch.float32,
                             device="cpu", seed=7)  # fmt: skip
    scales = torch.tensor([1 / 32, 1 / 16])
    shape = batch.k_cache.shape
    k8 = quantize(batch.k_cache.flatten(0, 1), scales).view(shape)
    v8 = quantize(batch.v_cache.flatten(0, 1), scales).view(shape)
    scale = 1 / math.sqrt(16)
    want = reference.paged_decode_attention(
        batch.q, k8, v8, batch.block_tables, batch.seq_lens, scale, batch.max_seq_len,
        k_scale=scales, v_scale=scales,
    ).float()  # fmt: skip
    got = decode_vt(batch.q, k8, transposed_values(v8), batch.block_tables, batch.seq_lens,
                    scales, scales, scale, splits, block_n=block_n)  # fmt: skip
    assert (got - want).norm() / want.norm() < 2e-3
