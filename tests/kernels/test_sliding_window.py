"""Sliding-window attention: the reference against a dense mask, the kernels against the reference.

Blocks wholly before a sequence's window are "freed" in every test: their table entries point
at a huge block id and their cache rows are NaN, so a kernel that reads one faults or fails.
"""

from __future__ import annotations

import math

import pytest
import torch
from troupe.kernels import reference
from troupe.kernels.decode_attention import paged_decode_attention_triton
from troupe.kernels.paged_attention import paged_attention_triton
from troupe.kernels.paged_batch import PADDING_BLOCK_ID, PagedBatch, make_paged_batch

BLOCK = 4
CASES = {
    "prefill_past_window": [(0, 23)],
    "chunk_after_cache": [(17, 9)],
    "decodes": [(30, 1), (2, 1), (11, 1)],
    "mixed": [(29, 1), (0, 13), (6, 1), (9, 20)],
}
WINDOWS = [1, 5, 16, 64]


def _batch(lens: list[tuple[int, int]], window: int, group: int, seed: int) -> PagedBatch:
    """A random batch whose blocks before each sequence's window are freed (poisoned)."""
    batch = make_paged_batch(
        lens,
        num_q_heads=2 * group,
        num_kv_heads=2,
        head_dim=16,
        block_size=BLOCK,
        dtype=torch.float32,
        device="cpu",
        seed=seed,
    )
    for s, (ctx, _) in enumerate(lens):
        num_free = max(0, ctx - window + 1) // BLOCK
        for b in batch.block_tables[s, :num_free].tolist():
            batch.k_cache[b] = float("nan")
            batch.v_cache[b] = float("nan")
        batch.block_tables[s, :num_free] = PADDING_BLOCK_ID
    return batch


def _dense(batch: PagedBatch, window: int, scale: float) -> torch.Tensor:
    """Plain softmax attention per query over keys p - window < k <= p, from the cache."""
    out = torch.zeros_like(batch.q)
    starts = batch.query_start_loc.tolist()
    group = batch.q.shape[1] // batch.k_cache.shape[2]
    for s, seq_len in enumerate(batch.seq_lens.tolist()):
        for i, row in enumerate(range(starts[s], starts[s + 1])):
            pos = seq_len - (starts[s + 1] - starts[s]) + i
            keys = range(max(0, pos - window + 1), pos + 1)
            slots = [int(batch.block_tables[s, k // BLOCK]) * BLOCK + k % BLOCK for k in keys]
            k = batch.k_cache.view(-1, *batch.k_cache.shape[2:])[slots].repeat_interleave(group, 1)
            v = batch.v_cache.view(-1, *batch.v_cache.shape[2:])[slots].repeat_interleave(group, 1)
            weights = torch.softmax(torch.einsum("hd,khd->hk", batch.q[row], k) * scale, -1)
            out[row] = torch.einsum("hk,khd->hd", weights, v)
    return out


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any(), "NaN: a read before the window or an unwritten row"
    return float((out - ref).norm() / ref.norm())


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_matches_dense_window(case: str, window: int) -> None:
    batch = _batch(CASES[case], window, group=2, seed=window)
    dense = _dense(batch, window, 0.25)
    got = reference.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
        batch.query_start_loc, 0.25, batch.max_query_len, batch.max_seq_len,
        sliding_window=window,
    )  # fmt: skip
    assert _rel_err(got, dense) < 1e-5
    if all(new == 1 for _, new in CASES[case]):
        decode = reference.paged_decode_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
            batch.max_seq_len, sliding_window=window,
        )  # fmt: skip
        assert _rel_err(decode, dense) < 1e-5


def test_window_changes_the_result() -> None:
    """The window is not a no-op: a window shorter than the context changes the output."""
    batch = _batch([(20, 4)], 64, group=1, seed=3)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, 0.25, batch.max_query_len, batch.max_seq_len)  # fmt: skip
    full = reference.paged_attention(*args)
    assert _rel_err(reference.paged_attention(*args, sliding_window=64), full) == 0.0
    assert _rel_err(reference.paged_attention(*args, sliding_window=5), full) > 1e-2


@pytest.mark.parametrize("window", [1, 5, 16])  # 16 = the interpreter's BLOCK_N
@pytest.mark.parametrize("case", sorted(CASES))
def test_paged_kernel_window_matches_reference(case: str, window: int) -> None:
    lens, group = CASES[case], 3
    batch = _batch(lens, window, group, seed=window * 7 + group)
    scale = 1 / math.sqrt(16)
    ref = reference.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
        batch.query_start_loc, scale, batch.max_query_len, batch.max_seq_len,
        sliding_window=window,
    )  # fmt: skip
    out = torch.full_like(batch.q, float("nan"))
    paged_attention_triton(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
        batch.query_start_loc, scale, batch.max_query_len, batch.max_seq_len,
        sliding_window=window, out=out,
    )  # fmt: skip
    assert _rel_err(out, ref) < 1e-4
    # leading one-token decodes through the decode kernel (the mixed-step path)
    num_decodes = next((i for i, (_, new) in enumerate(lens) if new != 1), len(lens))
    if num_decodes:
        out2 = torch.full_like(batch.q, float("nan"))
        paged_attention_triton(
            batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, scale, batch.max_query_len, batch.max_seq_len,
            torch.tensor([num_decodes], dtype=torch.int32), sliding_window=window, out=out2,
        )  # fmt: skip
        assert _rel_err(out2, ref) < 1e-4


@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("window", [1, 5, 16])
def test_decode_kernel_window_matches_reference(window: int, num_splits: int | None) -> None:
    batch = _batch(CASES["decodes"], window, group=3, seed=window + 11)
    ref = reference.paged_decode_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
        batch.max_seq_len, sliding_window=window,
    )  # fmt: skip
    out = torch.full_like(batch.q, float("nan"))
    paged_decode_attention_triton(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
        batch.max_seq_len, num_splits=num_splits, out=out, sliding_window=window,
    )  # fmt: skip
    assert _rel_err(out, ref) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("window", [100, 1000, 4096])
def test_window_kernels_on_gpu(window: int) -> None:
    """bf16, real head sizes: the tile kernel (with leading decodes) and the split decode."""
    lens = [(3000, 1), (700, 1), (0, 1500), (2000, 300)]
    batch = make_paged_batch(
        lens, num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16,
        dtype=torch.bfloat16, device="cuda", seed=window,
    )  # fmt: skip
    for s, (ctx, _) in enumerate(lens):  # free the blocks before each window
        num_free = max(0, ctx - window + 1) // 16
        for b in batch.block_tables[s, :num_free].tolist():
            batch.k_cache[b] = float("nan")
            batch.v_cache[b] = float("nan")
        batch.block_tables[s, :num_free] = PADDING_BLOCK_ID
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, 1 / math.sqrt(128), batch.max_query_len, batch.max_seq_len)  # fmt: skip
    ref = reference.paged_attention(*args, sliding_window=window)
    prefix = torch.tensor([2], dtype=torch.int32, device="cuda")
    out = paged_attention_triton(*args, prefix, sliding_window=window)
    assert _rel_err(out.float(), ref.float()) < 1e-2
