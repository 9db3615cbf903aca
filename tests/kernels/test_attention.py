"""Paged attention kernels against the torch reference.

CPU: fp32, tiny shapes, Triton under TRITON_INTERPRET=1.
GPU (-m gpu): bf16, real head sizes, bf16 error bound. Every cache slot no sequence owns is NaN
and outputs start as NaN, so stray reads and unwritten outputs fail.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import pytest
import torch
from pair_cover import pairwise
from triton_compiles import triton_compiles
from troupe.kernels import reference
from troupe.kernels.decode_attention import paged_decode_attention_triton
from troupe.kernels.ops import KernelBackend, KernelOps, select_ops
from troupe.kernels.paged_attention import paged_attention_triton
from troupe.kernels.paged_batch import make_paged_batch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# (block_size, num_kv_heads, head_dim, dtype, bound on ||out - ref|| / ||ref||)
SETUP = {
    "cpu": (4, 2, 16, torch.float32, 1e-4),
    "cuda": (16, 4, 128, torch.bfloat16, 1e-2),
}

# (cached prefix, new tokens) per sequence, in units of block_size (b) plus offsets.
PREFILL_CASES: dict[str, Callable[[int], list[tuple[int, int]]]] = {
    "context_len_1": lambda b: [(0, 1)],
    "one_full_block": lambda b: [(0, b)],
    "partial_last_block": lambda b: [(0, b + 3)],
    "cached_prefix_then_new": lambda b: [(2 * b, b + 3)],
    "many_blocks_decode": lambda b: [(7 * b + 2, 1)],
    "mixed_prefill_decode": lambda b: [(0, 5), (3 * b - 1, 1), (0, 1), (b, 2 * b), (b + 1, 1)],
}
DECODE_CASES: dict[str, Callable[[int], list[int]]] = {
    "context_len_1": lambda b: [1],
    "one_full_block": lambda b: [b],
    "partial_last_block": lambda b: [b + 3],
    "many_blocks": lambda b: [9 * b + 5],
    "mixed_lengths": lambda b: [1, 2 * b, 5, 6 * b + 3, b - 1],
}


def _seed(*parts: object) -> int:
    """A per-test seed: varied across tests, reproducible across runs."""
    return zlib.crc32(repr(parts).encode())


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any(), "output has NaN: unwritten elements or a stray read"
    return float((out.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("case", sorted(PREFILL_CASES))
def test_paged_attention_matches_reference(
    device: str, group: int, case: str, triton_ops: KernelOps
) -> None:
    block_size, num_kv_heads, head_dim, dtype, bound = SETUP[device]
    lens = PREFILL_CASES[case](block_size)
    if device == "cuda":
        lens = [(16 * ctx, new if new == 1 else 16 * new) for ctx, new in lens]
    seed = _seed(case, group, device)
    batch = make_paged_batch(
        lens,
        num_q_heads=group * num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        device=device,
        seed=seed,
    )
    scale = 1 / math.sqrt(head_dim)
    out = torch.full_like(batch.q, float("nan"))
    paged_attention_triton(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.seq_lens,
        batch.query_start_loc,
        scale,
        batch.max_query_len,
        batch.max_seq_len,
        out=out,
    )
    ref = reference.paged_attention(
        batch.q.float(),
        batch.k_cache.float(),
        batch.v_cache.float(),
        batch.block_tables,
        batch.seq_lens,
        batch.query_start_loc,
        scale,
        batch.max_query_len,
        batch.max_seq_len,
    )
    assert _rel_err(out, ref) < bound
    # The dispatcher's Triton ops take the same path and return the same numbers.
    via_ops = triton_ops.paged_attention(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.seq_lens,
        batch.query_start_loc,
        scale,
        batch.max_query_len,
        batch.max_seq_len,
    )
    torch.testing.assert_close(via_ops, out, rtol=0, atol=0)


# On the CPU a pairwise cover (tests/pair_cover.py): every case with every group, the splits
# (None: the dispatcher's own choice, checked against triton_ops too; one; three) rotating, so
# every pair of case, group and splits is met: 15 interpreter runs instead of the product's
# 45, which the GPU runs. Each case meets all three splits.
_SPLITS: list[int | None] = [None, 1, 3]
_DECODE_CPU = pairwise(
    [
        (case, group, _SPLITS[(c + g) % len(_SPLITS)])
        for c, case in enumerate(sorted(DECODE_CASES))
        for g, group in enumerate([1, 3, 8])
    ],
    [sorted(DECODE_CASES), [1, 3, 8], _SPLITS],
)
_DECODE_PARAMS = [
    pytest.param(case, group, splits, "cpu", id=f"{case}-{group}-{splits}-cpu")
    for case, group, splits in _DECODE_CPU
] + [
    pytest.param(
        case, group, splits, "cuda", marks=pytest.mark.gpu, id=f"{case}-{group}-{splits}-cuda"
    )
    for case in sorted(DECODE_CASES)
    for group in (1, 3, 8)
    for splits in _SPLITS
]


@pytest.mark.parametrize(("case", "group", "num_splits", "device"), _DECODE_PARAMS)
def test_paged_decode_matches_reference(
    device: str, group: int, case: str, num_splits: int | None, triton_ops: KernelOps
) -> None:
    block_size, num_kv_heads, head_dim, dtype, bound = SETUP[device]
    seq_lens = DECODE_CASES[case](block_size)
    if device == "cuda":
        seq_lens = [n if n == 1 else 16 * n for n in seq_lens]
    seed = _seed(case, group, device, num_splits)
    batch = make_paged_batch(
        [(n - 1, 1) for n in seq_lens],
        num_q_heads=group * num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        device=device,
        seed=seed,
    )
    scale = 1 / math.sqrt(head_dim)
    out = torch.full_like(batch.q, float("nan"))
    paged_decode_attention_triton(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.seq_lens,
        scale,
        batch.max_seq_len,
        num_splits=num_splits,
        out=out,
    )
    ref = reference.paged_decode_attention(
        batch.q.float(),
        batch.k_cache.float(),
        batch.v_cache.float(),
        batch.block_tables,
        batch.seq_lens,
        scale,
        batch.max_seq_len,
    )
    assert _rel_err(out, ref) < bound
    if num_splits is None:
        via_ops = triton_ops.paged_decode_attention(
            batch.q,
            batch.k_cache,
            batch.v_cache,
            batch.block_tables,
            batch.seq_lens,
            scale,
            batch.max_seq_len,
        )
        torch.testing.assert_close(via_ops, out, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_decode_equals_last_row_of_prefill(backend: KernelBackend) -> None:
    """A decode step is the last query of the same sequence run through paged_attention."""
    ops = select_ops(torch.device("cpu"), backend)
    batch = make_paged_batch(
        [(10, 1), (3, 1)],
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=4,
        dtype=torch.float32,
        device="cpu",
        seed=7,
    )
    decode = ops.paged_decode_attention(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.seq_lens,
        0.25,
        batch.max_seq_len,
    )
    prefill = ops.paged_attention(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.seq_lens,
        batch.query_start_loc,
        0.25,
        1,
        batch.max_seq_len,
    )
    torch.testing.assert_close(decode, prefill, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group", [1, 3, 8])
def test_mixed_step_with_decode_prefix_and_padding(device: str, group: int) -> None:
    """The layout a mixed-step CUDA graph replays: one-token decodes first (sent to the decode
    kernel through decode_prefix), prefill chunks after, then padding sequences with no tokens
    and padding token rows owned by nobody. Real rows match the reference; padding rows are
    never written (they stay NaN)."""
    block_size, num_kv_heads, head_dim, dtype, bound = SETUP[device]
    b = block_size
    lens = [(3 * b + 1, 1), (5, 1), (9 * b, 1), (0, 2 * b + 3), (b + 2, 3 * b)]
    if device == "cuda":
        lens = [(16 * ctx, new if new == 1 else 16 * new) for ctx, new in lens]
    batch = make_paged_batch(
        lens,
        num_q_heads=group * num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        device=device,
        seed=_seed("mixed-prefix", group, device),
    )
    num_tokens = batch.q.shape[0]
    pad_seqs, pad_tokens = 3, 5
    q = torch.cat([batch.q, torch.randn_like(batch.q[:pad_tokens])])
    qsl = torch.cat([batch.query_start_loc, batch.query_start_loc[-1:].repeat(pad_seqs)])
    seq_lens = torch.cat([batch.seq_lens, torch.ones_like(batch.seq_lens[:pad_seqs])])
    tables = torch.cat([batch.block_tables, torch.zeros_like(batch.block_tables[:pad_seqs])])
    prefix = torch.tensor([3], dtype=torch.int32, device=device)
    scale = 1 / math.sqrt(head_dim)
    out = torch.full_like(q, float("nan"))
    paged_attention_triton(
        q, batch.k_cache, batch.v_cache, tables, seq_lens, qsl, scale,
        batch.max_query_len, batch.max_seq_len, prefix, out=out,
    )  # fmt: skip
    ref = reference.paged_attention(
        batch.q.float(), batch.k_cache.float(), batch.v_cache.float(), batch.block_tables,
        batch.seq_lens, batch.query_start_loc, scale, batch.max_query_len, batch.max_seq_len,
    )  # fmt: skip
    assert _rel_err(out[:num_tokens], ref) < bound
    assert out[num_tokens:].isnan().all(), "a padding row was written"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_eager_steps_of_any_shape_share_one_compile() -> None:
    """Steps run eagerly (past the mixed graphs' token counts) have any sequence count and
    block-table width; after one step of each form (with and without leading decodes) none of
    them compiles a kernel: counted by Triton's post-compile hook. Specialized on those values,
    a burst's first eager steps compiled three variants (~1.5 s each)."""
    block_size, num_kv_heads, head_dim, dtype, bound = SETUP["cuda"]
    scale = 1 / math.sqrt(head_dim)

    def step(lens: list[tuple[int, int]], width: int, num_decodes: int) -> None:
        batch = make_paged_batch(
            lens,
            num_q_heads=2 * num_kv_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            dtype=dtype,
            device="cuda",
            seed=_seed("eager", len(lens), width),
        )
        need = -(-batch.max_seq_len // block_size)  # the batch's table has padding columns
        assert need <= width
        tables = batch.block_tables[:, :need]
        tables = torch.cat([tables, tables[:, :1].expand(-1, width - need)], dim=1)
        prefix = torch.tensor([num_decodes], dtype=torch.int32, device="cuda")
        out = paged_attention_triton(
            batch.q, batch.k_cache, batch.v_cache, tables, batch.seq_lens,
            batch.query_start_loc, scale, batch.max_query_len, batch.max_seq_len,
            prefix if num_decodes else None,
        )  # fmt: skip
        ref = reference.paged_attention(
            batch.q.float(), batch.k_cache.float(), batch.v_cache.float(), batch.block_tables,
            batch.seq_lens, batch.query_start_loc, scale, batch.max_query_len,
            batch.max_seq_len,
        )  # fmt: skip
        assert _rel_err(out, ref) < bound

    def lens(num_seqs: int, num_decodes: int) -> list[tuple[int, int]]:
        return [(3 * block_size + i, 1) for i in range(num_decodes)] + [
            (block_size * (i % 3), 40 + 7 * i) for i in range(num_seqs - num_decodes)
        ]

    step(lens(16, 0), 32, 0)
    step(lens(9, 3), 32, 3)
    torch.cuda.synchronize()
    with triton_compiles() as compiled:
        step([(0, 9)], 1, 0)  # one sequence, a table one block wide
        step(lens(7, 0), 21, 0)
        step(lens(37, 0), 33, 0)
        # the same decodes (so the same split count, a constexpr) under other table widths
        step(lens(9, 3), 25, 3)
        step(lens(9, 3), 17, 3)
        torch.cuda.synchronize()
    assert compiled == []
