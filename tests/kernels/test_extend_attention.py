"""The extend kernel (new keys from the step's own K/V rows) against the torch reference.

The new tokens' K and V are laid out as the model leaves them (kernels/paged_batch.py's
fused_new_kv: columns of fused qkv rows, equal to what the cache holds). CPU: fp32 under
TRITON_INTERPRET=1, through TMA tensor descriptors and through pointer loads. GPU (-m gpu): bf16, real head sizes. Unowned cache slots are NaN and outputs
start NaN, so stray reads and unwritten rows fail.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import pytest
import torch
from pair_cover import pairwise
from troupe.kernels import reference
from troupe.kernels.extend_attention import extend_attention_triton
from troupe.kernels.ops import KernelOps
from troupe.kernels.paged_batch import PagedBatch, fused_new_kv, make_paged_batch
from troupe.kernels.qkv_prepare import prepare_qkv_triton
from troupe.kernels.rope_cache import build_cos_sin_cache

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# (num_kv_heads, head_dim, dtype, bound on ||out - ref|| / ||ref||)
SETUP = {"cpu": (2, 16, torch.float32, 1e-4), "cuda": (4, 128, torch.bfloat16, 1e-2)}
# (cached prefix, new tokens) per sequence, in units of block_size (b) plus offsets
CASES = {
    "no_prefix": lambda b: [(0, 2 * b + 3)],
    "prefix_then_new": lambda b: [(2 * b + 1, 3 * b - 2)],
    "mixed": lambda b: [(0, 5), (3 * b - 1, 1), (0, 1), (b, 2 * b), (b + 1, 7), (0, 4 * b + 1)],
}


def _batch(device: str, case: str, group: int, block_size: int) -> PagedBatch:
    num_kv_heads, head_dim, dtype, _ = SETUP[device]
    lens = CASES[case](block_size)
    if device == "cuda":  # GPU tiles are 64 keys: make the sequences span several
        lens = [(8 * ctx, new if new == 1 else 8 * new) for ctx, new in lens]
    return make_paged_batch(
        lens,
        num_q_heads=group * num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        device=device,
        seed=zlib.crc32(repr((device, case, group, block_size)).encode()),
    )


def _reference(batch: PagedBatch, scale: float) -> torch.Tensor:
    return reference.paged_attention(
        batch.q.float(), batch.k_cache.float(), batch.v_cache.float(), batch.block_tables,
        batch.seq_lens, batch.query_start_loc, scale, batch.max_query_len, batch.max_seq_len,
    )  # fmt: skip


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any(), "output has NaN: unwritten elements or a stray read"
    return float((out.float() - ref.float()).norm() / ref.float().norm())


# On the CPU (the interpreter runs every program instance in Python) a pairwise cover: every
# pair of values of any two of case, group, block size and load path is met, in 9 launches
# instead of the whole product's 36, which the GPU runs. The largest (mixed, 8, 32) is in it.
_CPU_PAIRS = pairwise(
    [
        ("mixed", 1, 4, True),
        ("mixed", 3, 4, False),
        ("mixed", 8, 32, True),
        ("no_prefix", 1, 32, False),
        ("no_prefix", 3, 32, True),
        ("no_prefix", 8, 4, False),
        ("prefix_then_new", 1, 32, True),
        ("prefix_then_new", 3, 4, True),
        ("prefix_then_new", 8, 32, False),
    ],
    [sorted(CASES), [1, 3, 8], [4, 32], [True, False]],
)


def _param(case: str, group: int, block_size: int, tma: bool, device: str) -> Any:
    load = "tma" if tma else "pointers"
    marks = [pytest.mark.gpu] if device == "cuda" else []
    name = f"{case}-{group}-{block_size}-{load}-{device}"
    return pytest.param(case, group, block_size, tma, device, marks=marks, id=name)


_PARAMS = [_param(*pair, "cpu") for pair in _CPU_PAIRS] + [
    _param(case, group, block_size, tma, "cuda")
    for case in sorted(CASES)
    for group in (1, 3, 8)
    for block_size in (16, 32)
    for tma in (True, False)
]


@pytest.mark.parametrize(("case", "group", "block_size", "tma", "device"), _PARAMS)
def test_extend_matches_reference(
    device: str, tma: bool, block_size: int, group: int, case: str
) -> None:
    """Block size 4 tiles the CPU's 16-key blocks (one table load per page), 32 does not
    (per-key slots); the GPU's 64-key tiles take 16 and 32 whole. The Triton kernel's forms
    (sm_90's own kernel: tests/kernels/test_prefill_hopper.py)."""
    batch = _batch(device, case, group, block_size)
    scale = 1 / math.sqrt(batch.q.shape[2])
    out = torch.full_like(batch.q, float("nan"))
    extend_attention_triton(
        batch.q, batch.k_cache, batch.v_cache, fused_new_kv(batch),
        batch.block_tables, batch.seq_lens, batch.query_start_loc, scale, batch.max_seq_len,
        out=out, tma=tma, hopper=False,
    )  # fmt: skip
    assert _rel_err(out, _reference(batch, scale)) < SETUP[device][3]


@pytest.mark.parametrize("device", DEVICES)
def test_new_keys_are_read_from_the_rows(device: str) -> None:
    """The new tokens' cache slots poisoned after the rows were taken: the kernel must not read
    them (the prefix still comes from the cache), and the answer is unchanged."""
    batch = _batch(device, "mixed", 3, 16)
    new_kv = fused_new_kv(batch)
    scale = 1 / math.sqrt(batch.q.shape[2])
    ref = _reference(batch, scale)
    block_size = batch.k_cache.shape[1]
    starts = batch.query_start_loc.tolist()
    for s, seq_len in enumerate(batch.seq_lens.tolist()):
        q_len = starts[s + 1] - starts[s]
        if q_len == 1:
            continue  # a one-token row without decode_prefix: the extend kernel serves it too
        for pos in range(seq_len - q_len, seq_len):
            page = int(batch.block_tables[s, pos // block_size])
            batch.k_cache[page, pos % block_size] = float("nan")
            batch.v_cache[page, pos % block_size] = float("nan")
    out = extend_attention_triton(
        batch.q, batch.k_cache, batch.v_cache, new_kv, batch.block_tables,
        batch.seq_lens, batch.query_start_loc, scale, batch.max_seq_len,
    )  # fmt: skip
    assert _rel_err(out, ref) < SETUP[device][3]


@pytest.mark.parametrize("device", DEVICES)
def test_decode_prefix_rows_go_to_the_decode_kernel(device: str, triton_ops: KernelOps) -> None:
    """One-token decodes first (decode_prefix), prefill chunks after, padding rows last: the
    dispatcher's paged_attention with new_kv matches the reference, padding rows stay NaN."""
    b = 16
    num_kv_heads, head_dim, dtype, bound = SETUP[device]
    lens = [(3 * b + 1, 1), (5, 1), (0, 2 * b + 3), (b + 2, 3 * b)]
    batch = make_paged_batch(
        lens, num_q_heads=3 * num_kv_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        block_size=b, dtype=dtype, device=device, seed=7,
    )  # fmt: skip
    num_tokens = batch.q.shape[0]
    q = torch.cat([batch.q, torch.randn_like(batch.q[:4])])
    qsl = torch.cat([batch.query_start_loc, batch.query_start_loc[-1:].repeat(2)])
    seq_lens = torch.cat([batch.seq_lens, torch.ones_like(batch.seq_lens[:2])])
    tables = torch.cat([batch.block_tables, torch.zeros_like(batch.block_tables[:2])])
    prefix = torch.tensor([2], dtype=torch.int32, device=device)
    scale = 1 / math.sqrt(head_dim)
    padded = PagedBatch(q, batch.k_cache, batch.v_cache, tables, seq_lens, qsl, 0, 0)
    out = triton_ops.paged_attention(
        q, batch.k_cache, batch.v_cache, tables, seq_lens, qsl, scale, batch.max_query_len,
        batch.max_seq_len, prefix, new_kv=fused_new_kv(padded),
    )  # fmt: skip
    assert _rel_err(out[:num_tokens], _reference(batch, scale)) < bound
    paged = triton_ops.paged_attention(
        q, batch.k_cache, batch.v_cache, tables, seq_lens, qsl, scale, batch.max_query_len,
        batch.max_seq_len, prefix,
    )  # fmt: skip
    # the two kernels sum in other orders: equal in fp32, within bf16's rounding on the GPU
    assert _rel_err(out[:num_tokens], paged[:num_tokens]) < (1e-5 if device == "cpu" else 1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_prepare_qkv_keep_k_leaves_the_cached_k_in_the_rows(device: str) -> None:
    """keep_k: qkv's k columns end as the normed, rotated k the cache got; v and q's columns
    are as they were; the returned q is unchanged by the flag."""
    num_kv_heads, head_dim, dtype, _ = SETUP[device]
    num_tokens, group, block_size = 9, 3, 4
    gen = torch.Generator().manual_seed(3)
    width = (group + 2) * num_kv_heads * head_dim
    qkv = (torch.randn(num_tokens, width, generator=gen) * 2).to(device, dtype)
    norm = (torch.randn(head_dim, generator=gen) * 0.5 + 1).to(device, dtype)
    cache_shape = (num_tokens // block_size + 1, block_size, num_kv_heads, head_dim)
    slots = torch.randperm(num_tokens, generator=gen).to(device)
    args = {
        "q_norm_weight": norm,
        "k_norm_weight": norm,
        "eps": 1e-6,
        "positions": torch.arange(num_tokens, device=device) * 37,
        "cos_sin_cache": build_cos_sin_cache(head_dim, 4096, 1e6, None, torch.float32, device),
        "slot_mapping": slots,
    }

    def caches() -> tuple[torch.Tensor, torch.Tensor]:
        k, v = (torch.full(cache_shape, float("nan"), dtype=dtype, device=device) for _ in "kv")
        return k, v

    k_plain, v_plain = caches()
    q_plain = prepare_qkv_triton(qkv.clone(), k_cache=k_plain, v_cache=v_plain, **args)
    kept = qkv.clone()
    k_cache, v_cache = caches()
    q = prepare_qkv_triton(kept, k_cache=k_cache, v_cache=v_cache, keep_k=True, **args)
    torch.testing.assert_close(q, q_plain, rtol=0, atol=0)
    q_size, kv_size = group * num_kv_heads * head_dim, num_kv_heads * head_dim
    k_rows = k_cache.flatten(0, 1)[slots].flatten(1)
    torch.testing.assert_close(kept[:, q_size : q_size + kv_size], k_rows, rtol=0, atol=0)
    torch.testing.assert_close(kept[:, :q_size], qkv[:, :q_size], rtol=0, atol=0)
    torch.testing.assert_close(kept[:, q_size + kv_size :], qkv[:, q_size + kv_size :])
    assert not torch.equal(kept[:, q_size : q_size + kv_size], qkv[:, q_size : q_size + kv_size])
    # The reference does the same.
    ref_rows = qkv.float().clone()
    k_ref, v_ref = (c.float() for c in caches())
    ref_args = {n: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                for n, t in args.items()}  # fmt: skip
    reference.prepare_qkv(ref_rows, k_cache=k_ref, v_cache=v_ref, keep_k=True, **ref_args)
    k_cols = slice(q_size, q_size + kv_size)
    assert _rel_err(kept[:, k_cols], ref_rows[:, k_cols]) < SETUP[device][3]  # bf16 rounding
