"""The decode kernels' launch order (kernels/decode_order.py): longest first, and the output
bit for bit the same in any order, bf16/fp32 and fp8 caches, one split or several."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from fp8_batch import fp8_batch
from troupe.kernels.decode_attention import (
    DEFAULT_CONFIG,
    FP8_DEFAULT_CONFIG,
    paged_decode_attention_triton,
)
from troupe.kernels.decode_order import longest_first
from troupe.kernels.paged_attention import paged_attention_triton
from troupe.kernels.paged_batch import make_paged_batch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def test_longest_first_keeps_batch_order_among_ties() -> None:
    got = longest_first(np.array([3, 9, 1, 9, 3], dtype=np.int32))
    assert got.dtype == np.int32 and got.tolist() == [1, 3, 0, 4, 2]
    # a mixed step: its three leading decodes sorted, the chunks after them as they come
    assert longest_first(np.array([3, 9, 5, 100, 2], dtype=np.int32), 3).tolist() == [1, 2, 0, 3, 4]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("fp8", [False, True])
def test_any_order_gives_the_same_bits(device: str, num_splits: int, fp8: bool) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    lens = [1, 9, 30, 17, 2] if device == "cpu" else [1, 500, 3000, 17, 2]
    if fp8:
        batch, k_scale, v_scale = fp8_batch([(n - 1, 1) for n in lens], device, seed=3)
        scales = {"k_scale": k_scale, "v_scale": v_scale}
    else:
        batch = make_paged_batch(
            [(n - 1, 1) for n in lens], num_q_heads=4, num_kv_heads=2, head_dim=16,
            block_size=4, dtype=torch.float32, device=device, seed=3,
        )  # fmt: skip
        scales = {}
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
            batch.max_seq_len)  # fmt: skip
    plain = paged_decode_attention_triton(*args, num_splits=num_splits, **scales)
    order = torch.from_numpy(longest_first(batch.seq_lens.cpu().numpy())).to(device)
    assert order.tolist() == ([2, 3, 1, 4, 0] if device == "cpu" else [2, 1, 3, 4, 0])
    ordered = paged_decode_attention_triton(*args, num_splits=num_splits, seq_order=order, **scales)
    torch.testing.assert_close(ordered, plain, rtol=0, atol=0)
    # a config that does not follow the order launches in batch order: the same again
    unordered = paged_decode_attention_triton(
        *args, num_splits=num_splits, seq_order=order,
        config=replace(FP8_DEFAULT_CONFIG if fp8 else DEFAULT_CONFIG, follow_order=False),
        **scales,
    )  # fmt: skip
    torch.testing.assert_close(unordered, plain, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_step_decodes_in_any_order_same_bits(device: str) -> None:
    """The decodes leading a mixed step go to the decode kernel in the order given."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    scale = 16 if device == "cuda" else 1
    lens = [(4 * scale, 1), (20 * scale, 1), (9 * scale, 1), (3 * scale, 5 * scale)]
    batch = make_paged_batch(
        lens, num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.float32,
        device=device, seed=5,
    )  # fmt: skip
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, 0.25, batch.max_query_len, batch.max_seq_len,
            torch.tensor([3], dtype=torch.int32, device=device))  # fmt: skip
    plain = paged_attention_triton(*args)
    order = torch.from_numpy(longest_first(batch.seq_lens.cpu().numpy(), 3)).to(device)
    assert order.tolist() == [1, 2, 0, 3]
    torch.testing.assert_close(
        paged_attention_triton(*args, seq_order=order), plain, rtol=0, atol=0
    )
