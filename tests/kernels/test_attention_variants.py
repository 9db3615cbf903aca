"""Every decode and prefill variant (DecodeVariant, PrefillVariant) against the torch reference
under TRITON_INTERPRET=1: split counts, sliding windows, fp8 caches, num_valid, a page larger
than the key tile (PAGED falls back to per-key lookups) and logits large enough that LAZY
rescales mid-loop. Unowned cache slots are NaN and outputs start NaN, so stray reads fail.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from troupe.kernels import reference
from troupe.kernels.decode_attention import (
    DecodeConfig,
    DecodeVariant,
    choose_num_splits,
    paged_decode_attention_triton,
)
from troupe.kernels.kv_quant import quantize
from troupe.kernels.paged_attention import (
    PrefillConfig,
    PrefillVariant,
    paged_attention_triton,
)
from troupe.kernels.paged_batch import PagedBatch, make_paged_batch

BOUND = 1e-4  # fp32 on the CPU


def _batch(lens: list[tuple[int, int]], block_size: int, seed: int) -> PagedBatch:
    return make_paged_batch(
        lens, num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=block_size,
        dtype=torch.float32, device="cpu", seed=seed,
    )  # fmt: skip


def _fp8(batch: PagedBatch) -> tuple[PagedBatch, torch.Tensor, torch.Tensor]:
    k_scale = torch.tensor([0.02, 0.03])
    v_scale = torch.tensor([0.025, 0.015])
    k8 = quantize(batch.k_cache.flatten(0, 1), k_scale).view(batch.k_cache.shape)
    v8 = quantize(batch.v_cache.flatten(0, 1), v_scale).view(batch.v_cache.shape)
    return dataclasses.replace(batch, k_cache=k8, v_cache=v8), k_scale, v_scale


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any(), "NaN: a stray read or an unwritten row"
    return float((out - ref).norm() / ref.norm())


@pytest.mark.parametrize("variant", list(DecodeVariant))
@pytest.mark.parametrize(("splits", "window"), [(1, 0), (3, 0), (None, 6)])
def test_decode_variant_matches_reference(
    variant: DecodeVariant, splits: int | None, window: int
) -> None:
    seq_lens = [1, 41, 30]
    batch = _batch([(n - 1, 1) for n in seq_lens], 4, seed=len(seq_lens) + window)
    # splits=None: a policy of 4 programs per SM (the interpreter reports 4 SMs), up to 8 splits
    config = DecodeConfig(variant=variant, programs_per_sm=4, max_splits=8, min_split=4)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
            batch.max_seq_len)  # fmt: skip
    ref = reference.paged_decode_attention(*args, sliding_window=window)
    for _ in range(2 if variant is DecodeVariant.FUSED else 1):  # counters left zero?
        out = torch.full_like(batch.q, float("nan"))
        paged_decode_attention_triton(
            *args, num_splits=splits, config=config, out=out, sliding_window=window
        )
        assert _rel_err(out, ref) < BOUND


def test_decode_fp8_num_valid_and_big_pages() -> None:
    """An fp8 cache takes kernels/decode_attention_fp8.py's kernel (any DecodeVariant); it
    rounds q and the probabilities to fp16, so the reference gets the fp16-rounded q."""
    seq_lens = [70, 5, 33, 20]
    # block_size 32 > the interpreter's 16-key tile: per-key block ids instead of one a page
    for block_size in (4, 32):
        batch, k_scale, v_scale = _fp8(_batch([(n - 1, 1) for n in seq_lens], block_size, 3))
        args = (batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
                batch.max_seq_len)  # fmt: skip
        ref = reference.paged_decode_attention(
            batch.q.half().float(), *args, k_scale=k_scale, v_scale=v_scale
        )
        out = torch.full_like(batch.q, float("nan"))
        num_valid = torch.tensor([3], dtype=torch.int32)
        paged_decode_attention_triton(
            batch.q, *args, num_splits=3, out=out, num_valid=num_valid, k_scale=k_scale,
            v_scale=v_scale,
        )  # fmt: skip
        assert out[3:].isnan().all(), "rows past num_valid were written"
        assert _rel_err(out[:3], ref[:3]) < 1e-3


@pytest.mark.parametrize("variant", list(PrefillVariant))
@pytest.mark.parametrize("window", [0, 7])
def test_prefill_variant_matches_reference(variant: PrefillVariant, window: int) -> None:
    lens = [(11, 1), (4, 40), (5, 21)]
    batch = _batch(lens, 4, seed=window)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, 0.25, batch.max_query_len, batch.max_seq_len)  # fmt: skip
    ref = reference.paged_attention(*args, sliding_window=window)
    out = torch.full_like(batch.q, float("nan"))
    config = PrefillConfig(variant=variant)
    paged_attention_triton(*args, config=config, out=out, sliding_window=window)
    assert _rel_err(out, ref) < BOUND


@pytest.mark.parametrize("variant", list(PrefillVariant))
def test_prefill_variant_fp8_and_large_logits(variant: PrefillVariant) -> None:
    """Logits of std ~ 40: the row max grows by far more than 8 across key tiles, so LAZY
    rescales inside the loop, and a stale max would overflow or lose the new keys."""
    lens = [(20, 44)]
    batch, k_scale, v_scale = _fp8(_batch(lens, 4, seed=5))
    gen = torch.Generator().manual_seed(7)
    # increasing key scores along the sequence: each new tile holds the new row max
    ramp = torch.linspace(0.1, 3.0, batch.q.shape[0])[:, None, None]
    q = batch.q * 40 * ramp * (1 + 0.1 * torch.rand(batch.q.shape, generator=gen))
    args = (q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, 1 / math.sqrt(16), batch.max_query_len, batch.max_seq_len)  # fmt: skip
    ref = reference.paged_attention(*args, k_scale=k_scale, v_scale=v_scale)
    out = torch.full_like(q, float("nan"))
    paged_attention_triton(
        *args, config=PrefillConfig(variant=variant), out=out, k_scale=k_scale, v_scale=v_scale
    )
    assert _rel_err(out, ref) < BOUND


@pytest.mark.parametrize("variant", [DecodeVariant.TWO_PASS, DecodeVariant.FUSED])
def test_decode_merges_more_splits_than_one_chunk(variant: DecodeVariant) -> None:
    """40 splits: FUSED merges 32 at a time (a running max across two chunks)."""
    batch = _batch([(699, 1)], 4, seed=11)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
            batch.max_seq_len)  # fmt: skip
    ref = reference.paged_decode_attention(*args)
    out = torch.full_like(batch.q, float("nan"))
    paged_decode_attention_triton(
        *args, num_splits=40, config=DecodeConfig(variant=variant), out=out
    )
    assert _rel_err(out, ref) < BOUND


@pytest.mark.parametrize(
    ("num_seqs", "context", "splits"),
    [(1, 32768, 64), (8, 16384, 8), (4, 8192, 16), (1, 4096, 32), (32, 2048, 2), (64, 4096, 1),
     (256, 1024, 1), (1, 100, 1)],
)  # fmt: skip
def test_split_policy_picks_the_h200_sweeps_best(num_seqs: int, context: int, splits: int) -> None:
    """The default policy on the H200's 132 SMs (Qwen3-0.6B's 8 kv heads) picks the split count
    that replayed fastest in the graph sweep of 2026-12-03 (docs/benchmarks.md); one wave: 9
    splits at 8 x 16,384 (576 programs) ran 30% slower than 8."""
    assert choose_num_splits(num_seqs, 8, context, 132) == splits
