"""The extend kernel with sliding windows and fp8 caches against the torch reference.

Windows: blocks wholly before a sequence's window are freed (table entries a huge id, rows
NaN), and after the new rows are taken the new tokens' own cache slots are poisoned too, so
the kernel must read the prefix from the cache within the window and the new keys from the
rows. fp8: the rows hold the cache's units (x / scale on e4m3's grid, in q's dtype), as
prepare_qkv's keep_k leaves them. CPU: fp32 under TRITON_INTERPRET=1, 16-key tiles.
"""

from __future__ import annotations

import math

import pytest
import torch
from fp8_batch import fp8_batch, rel_err
from pair_cover import pairwise
from troupe.kernels import reference
from troupe.kernels.extend_attention import extend_attention_triton
from troupe.kernels.paged_batch import PADDING_BLOCK_ID, PagedBatch, fused_new_kv, make_paged_batch
from troupe.kernels.qkv_prepare import prepare_qkv_triton
from troupe.kernels.rope_cache import build_cos_sin_cache

BLOCK = 4
# (cached prefix, new tokens) per sequence: chunks past the 16-key tiles, after a prefix, mixed
CASES = {
    "long_chunk": [(0, 45)],
    "chunk_after_cache": [(37, 30)],
    "mixed": [(29, 1), (0, 13), (6, 1), (9, 50), (40, 17)],
}
WINDOWS = [1, 5, 16, 23, 64]


def _windowed_batch(lens: list[tuple[int, int]], window: int, group: int, seed: int) -> PagedBatch:
    batch = make_paged_batch(
        lens, num_q_heads=2 * group, num_kv_heads=2, head_dim=16, block_size=BLOCK,
        dtype=torch.float32, device="cpu", seed=seed,
    )  # fmt: skip
    for s, (ctx, _) in enumerate(lens):  # blocks before the first new token's window: freed
        num_free = max(0, ctx - window + 1) // BLOCK
        for b in batch.block_tables[s, :num_free].tolist():
            batch.k_cache[b] = float("nan")
            batch.v_cache[b] = float("nan")
        batch.block_tables[s, :num_free] = PADDING_BLOCK_ID
    return batch


def _poison_new_slots(batch: PagedBatch) -> None:
    starts = batch.query_start_loc.tolist()
    for s, seq_len in enumerate(batch.seq_lens.tolist()):
        for pos in range(seq_len - (starts[s + 1] - starts[s]), seq_len):
            page = int(batch.block_tables[s, pos // BLOCK])
            batch.k_cache[page, pos % BLOCK] = float("nan")
            batch.v_cache[page, pos % BLOCK] = float("nan")


def _args(batch: PagedBatch) -> tuple:
    return (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, 1 / math.sqrt(batch.q.shape[2]))  # fmt: skip


# A pairwise cover (tests/pair_cover.py): every case with every window, each pair taking the
# next (group, load) in turn, so every pair of values of any two parameters is met: 15
# interpreter launches instead of the whole product's 60.
_LOADS = [(1, True), (1, False), (3, True), (3, False)]
_COVER = pairwise(
    [
        (case, window, *_LOADS[(c + w) % len(_LOADS)])
        for c, case in enumerate(sorted(CASES))
        for w, window in enumerate(WINDOWS)
    ],
    [sorted(CASES), WINDOWS, [1, 3], [True, False]],
)


@pytest.mark.parametrize(
    ("case", "window", "group", "tma"),
    _COVER,
    ids=[f"{c}-{w}-{g}-{'tma' if t else 'pointers'}" for c, w, g, t in _COVER],
)
def test_windowed_extend_matches_reference(case: str, window: int, group: int, tma: bool) -> None:
    batch = _windowed_batch(CASES[case], window, group, seed=window * 7 + group)
    q, k_cache, v_cache, tables, seq_lens, qsl, scale = _args(batch)
    ref = reference.paged_attention(
        q, k_cache, v_cache, tables, seq_lens, qsl, scale, batch.max_query_len,
        batch.max_seq_len, sliding_window=window,
    )  # fmt: skip
    new_kv = fused_new_kv(batch)
    _poison_new_slots(batch)
    out = torch.full_like(q, float("nan"))
    extend_attention_triton(
        q, k_cache, v_cache, new_kv, tables, seq_lens, qsl, scale, batch.max_seq_len,
        sliding_window=window, out=out, tma=tma,
    )  # fmt: skip
    assert rel_err(out, ref) < 1e-4


def test_window_hides_keys_in_the_extend_kernel() -> None:
    """The window is applied: a window shorter than the chunk changes the answer."""
    batch = _windowed_batch(CASES["chunk_after_cache"], 1000, 2, seed=5)
    q, k_cache, v_cache, tables, seq_lens, qsl, scale = _args(batch)
    new_kv = fused_new_kv(batch)
    full = extend_attention_triton(q, k_cache, v_cache, new_kv, tables, seq_lens, qsl, scale, 67)
    windowed = extend_attention_triton(
        q, k_cache, v_cache, new_kv, tables, seq_lens, qsl, scale, 67, sliding_window=20
    )
    assert rel_err(windowed, full) > 1e-2


@pytest.mark.parametrize("window", [0, 5, 23])
@pytest.mark.parametrize("tma", [True, False], ids=["tma", "pointers"])
def test_extend_reads_fp8(window: int, tma: bool) -> None:
    """An fp8 cache and rows in its units; leading decodes through the decode kernel."""
    lens = [(30, 1), (13, 1), (0, 9), (5, 27), (41, 19)]
    batch, k_scale, v_scale = fp8_batch(lens, "cpu", seed=8)
    q, k_cache, v_cache, tables, seq_lens, qsl, scale = _args(batch)
    ref = reference.paged_attention(
        q, k_cache, v_cache, tables, seq_lens, qsl, scale, batch.max_query_len,
        batch.max_seq_len, sliding_window=window, k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip
    new_kv = fused_new_kv(batch)
    prefix = torch.tensor([2], dtype=torch.int32)
    out = extend_attention_triton(
        q, k_cache, v_cache, new_kv, tables, seq_lens, qsl, scale, batch.max_seq_len, prefix,
        sliding_window=window, k_scale=k_scale, v_scale=v_scale, tma=tma,
    )  # fmt: skip
    assert rel_err(out, ref) < 1e-4
    # the scales are applied: unscaled rows would be far off
    wrong = extend_attention_triton(
        q, k_cache, v_cache, new_kv, tables, seq_lens, qsl, scale, batch.max_seq_len, prefix,
        sliding_window=window, k_scale=k_scale * 2, v_scale=v_scale, tma=tma,
    )  # fmt: skip
    assert rel_err(wrong, ref) > 1e-2


def test_prepare_qkv_keep_k_leaves_fp8_units_in_the_rows() -> None:
    """fp8 keep_k: qkv's k and v columns end as exactly the bytes the cache got, in qkv's
    dtype; q is unchanged by the flag; the reference does the same."""
    num_tokens, group, num_kv_heads, head_dim, block_size = 9, 3, 2, 16, 4
    gen = torch.Generator().manual_seed(3)
    width = (group + 2) * num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, width, generator=gen) * 2
    norm = torch.randn(head_dim, generator=gen) * 0.5 + 1
    k_scale = (0.5 + torch.rand(num_kv_heads, generator=gen)) / 64
    v_scale = (0.5 + torch.rand(num_kv_heads, generator=gen)) / 64
    cache_shape = (num_tokens // block_size + 1, block_size, num_kv_heads, head_dim)
    slots = torch.randperm(num_tokens, generator=gen)
    args = {
        "q_norm_weight": norm, "k_norm_weight": norm, "eps": 1e-6,
        "positions": torch.arange(num_tokens) * 37,
        "cos_sin_cache": build_cos_sin_cache(head_dim, 4096, 1e6, None, torch.float32, "cpu"),
        "slot_mapping": slots, "k_scale": k_scale, "v_scale": v_scale,
    }  # fmt: skip
    q_size, kv_size = group * num_kv_heads * head_dim, num_kv_heads * head_dim
    for impl in (prepare_qkv_triton, reference.prepare_qkv):
        k_cache = torch.zeros(cache_shape, dtype=torch.float8_e4m3fn)
        v_cache = torch.zeros(cache_shape, dtype=torch.float8_e4m3fn)
        plain = impl(qkv.clone(), k_cache=k_cache.clone(), v_cache=v_cache.clone(), **args)
        kept = qkv.clone()
        q = impl(kept, k_cache=k_cache, v_cache=v_cache, keep_k=True, **args)
        torch.testing.assert_close(q, plain, rtol=0, atol=0)
        k_rows = k_cache.flatten(0, 1)[slots].flatten(1).float()
        v_rows = v_cache.flatten(0, 1)[slots].flatten(1).float()
        assert k_rows.abs().sum() > 0
        torch.testing.assert_close(kept[:, q_size : q_size + kv_size], k_rows, rtol=0, atol=0)
        torch.testing.assert_close(kept[:, q_size + kv_size :], v_rows, rtol=0, atol=0)
        torch.testing.assert_close(kept[:, :q_size], qkv[:, :q_size], rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("window", [0, 100, 512])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_extend_window_fp8_on_cuda(window: int, fp8: bool) -> None:
    """bf16 q on real head sizes (64-key tiles, TMA), windows of Gemma 3's size and smaller."""
    lens = [(3000, 1), (0, 700), (900, 520), (130, 1100)]
    if fp8:
        batch, k_scale, v_scale = fp8_batch(lens, "cuda", seed=3)
        scales: dict[str, torch.Tensor] = {"k_scale": k_scale, "v_scale": v_scale}
    else:
        batch = make_paged_batch(
            lens, num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16,
            dtype=torch.bfloat16, device="cuda", seed=3,
        )  # fmt: skip
        scales = {}
    q, k_cache, v_cache, tables, seq_lens, qsl, scale = _args(batch)
    ref = reference.paged_attention(
        q.float(), k_cache if fp8 else k_cache.float(), v_cache if fp8 else v_cache.float(),
        tables, seq_lens, qsl, scale, batch.max_query_len, batch.max_seq_len,
        sliding_window=window, **scales,
    )  # fmt: skip
    prefix = torch.tensor([1], dtype=torch.int32, device="cuda")
    out = extend_attention_triton(
        q, k_cache, v_cache, fused_new_kv(batch), tables, seq_lens, qsl, scale,
        batch.max_seq_len, prefix, sliding_window=window, **scales,
    )  # fmt: skip
    assert rel_err(out, ref) < 1e-2
