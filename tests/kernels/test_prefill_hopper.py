"""The Hopper prefill kernel (kernels/prefill_hopper.py). Gluon has no interpreter form: the CPU
builds it for sm_90 (ops/prefill_hopper_check.py, a child process without TRITON_INTERPRET);
on a GPU (-m gpu; sm_90 only) it is checked against the fp32 reference on the extend kernel's
cases, with every cache slot past a sequence's prefix NaN (make_paged_batch's poison)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import zlib

import pytest
import torch
from troupe.kernels import reference
from troupe.kernels.extend_attention import extend_attention_triton
from troupe.kernels.paged_batch import PagedBatch, fused_new_kv, make_paged_batch

# (cached prefix, new tokens) per sequence: partial pages and tiles, a one-token chunk, a
# prefix of whole tiles, a sequence longer than two query tiles
CASES = {
    "no_prefix": [(0, 300)],
    "prefix_then_new": [(133, 381)],
    "mixed": [(0, 5), (383, 1), (0, 1), (128, 256), (129, 56), (0, 517), (2000, 70)],
}


def test_it_builds_for_sm90_without_spills() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "troupe.ops.prefill_hopper_check"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    for line in lines:
        figures = re.search(r"stack (\d+), (\d+) bytes .* (\d+) HGMMA, (\d+) UTMALDG", line)
        assert figures, line
        stack, smem, wgmma, loads = (int(x) for x in figures.groups())
        assert stack == 0 and smem <= 232448 and wgmma > 0 and loads > 0, line


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _batch(case: str, group: int, block_size: int) -> PagedBatch:
    return make_paged_batch(
        CASES[case], num_q_heads=4 * group, num_kv_heads=4, head_dim=128,
        block_size=block_size, dtype=torch.bfloat16, device="cuda",
        seed=zlib.crc32(repr((case, group, block_size)).encode()),
    )  # fmt: skip


def _reference(batch: PagedBatch, scale: float) -> torch.Tensor:
    return reference.paged_attention(
        batch.q.float(), batch.k_cache.float(), batch.v_cache.float(), batch.block_tables,
        batch.seq_lens, batch.query_start_loc, scale, batch.max_query_len, batch.max_seq_len,
    )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("pingpong", [True, False])
@pytest.mark.parametrize("block_size", [16, 32, 256])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("case", sorted(CASES))
def test_it_matches_the_reference(case: str, group: int, block_size: int, pingpong: bool) -> None:
    from troupe.kernels.prefill_hopper import hopper_prefill_ok, prefill_attention_hopper

    if not _sm90():
        pytest.skip("an sm_90 GPU")
    batch = _batch(case, group, block_size)
    new_kv = fused_new_kv(batch)
    assert hopper_prefill_ok(batch.q, batch.k_cache, new_kv, 0, False)
    scale = 1 / math.sqrt(128)
    out = torch.full_like(batch.q, float("nan"))
    prefill_attention_hopper(
        batch.q, batch.k_cache, batch.v_cache, new_kv, batch.block_tables, batch.seq_lens,
        batch.query_start_loc, scale, out, pingpong=pingpong, pack=1,
    )  # fmt: skip
    assert not out.isnan().any(), "a row unwritten, or a NaN slot reached P V"
    ref = _reference(batch, scale)
    assert (out.float() - ref).norm() / ref.norm() < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("group", [2, 8])
@pytest.mark.parametrize("case", [*sorted(CASES), "verify"])
def test_packed_heads_match_the_reference(case: str, group: int, block_size: int) -> None:
    """pack 2: an item is 64 tokens x two query heads of one kv head."""
    from troupe.kernels.prefill_hopper import prefill_attention_hopper

    if not _sm90():
        pytest.skip("an sm_90 GPU")
    lens = [(1000, 5)] * 40 if case == "verify" else CASES[case]
    batch = make_paged_batch(
        lens, num_q_heads=4 * group, num_kv_heads=4, head_dim=128, block_size=block_size,
        dtype=torch.bfloat16, device="cuda", seed=zlib.crc32(repr((case, group)).encode()),
    )  # fmt: skip
    scale = 1 / math.sqrt(128)
    out = torch.full_like(batch.q, float("nan"))
    prefill_attention_hopper(
        batch.q, batch.k_cache, batch.v_cache, fused_new_kv(batch), batch.block_tables,
        batch.seq_lens, batch.query_start_loc, scale, out, pack=2,
    )  # fmt: skip
    assert not out.isnan().any(), "a row unwritten, or a NaN slot reached P V"
    ref = _reference(batch, scale)
    assert (out.float() - ref).norm() / ref.norm() < 1e-2


def test_pack_names_its_limit() -> None:
    """Two query heads share an item only where they share a kv head: checked before any
    launch (CPU tensors reach no kernel)."""
    from troupe.kernels.prefill_hopper import prefill_attention_hopper

    batch = make_paged_batch([(0, 4)], num_q_heads=6, num_kv_heads=2, head_dim=128,
                             block_size=16, dtype=torch.bfloat16, device="cpu", seed=0)  # fmt: skip
    with pytest.raises(ValueError, match=r"pack: 1, or 2 .* got 2 with 3 query heads"):
        prefill_attention_hopper(
            batch.q, batch.k_cache, batch.v_cache, fused_new_kv(batch), batch.block_tables,
            batch.seq_lens, batch.query_start_loc, 0.1, torch.empty_like(batch.q), pack=2,
        )  # fmt: skip


@pytest.mark.gpu
def test_the_extend_entry_takes_it_and_leaves_decodes_and_padding() -> None:
    """extend_attention_triton picks this kernel on sm_90: decodes first (decode_prefix, the
    decode kernel's), padding sequences of no tokens last (a CUDA graph's), rows past the last
    sequence untouched; the Triton extend kernel's answer agrees."""
    if not _sm90():
        pytest.skip("an sm_90 GPU")
    lens = [(300, 1), (17, 1), (0, 700), (150, 129)]
    batch = make_paged_batch(lens, num_q_heads=16, num_kv_heads=8, head_dim=128, block_size=16,
                             dtype=torch.bfloat16, device="cuda", seed=3)  # fmt: skip
    n = batch.q.shape[0]
    q = torch.cat([batch.q, torch.randn_like(batch.q[:5])])
    qsl = torch.cat([batch.query_start_loc, batch.query_start_loc[-1:].repeat(2)])
    seq_lens = torch.cat([batch.seq_lens, torch.ones_like(batch.seq_lens[:2])])
    tables = torch.cat([batch.block_tables, torch.zeros_like(batch.block_tables[:2])])
    padded = PagedBatch(q, batch.k_cache, batch.v_cache, tables, seq_lens, qsl, 0, 0)
    prefix = torch.tensor([2], dtype=torch.int32, device="cuda")
    scale = 1 / math.sqrt(128)
    outs = []
    for hopper in (True, False):
        out = torch.full_like(q, float("nan"))
        extend_attention_triton(
            q, batch.k_cache, batch.v_cache, fused_new_kv(padded), tables, seq_lens, qsl, scale,
            batch.max_seq_len, prefix, out=out, hopper=hopper,
        )  # fmt: skip
        outs.append(out)
    assert outs[0][n:].isnan().all(), "padding rows written"
    ref = _reference(batch, scale)
    for out in outs:
        assert (out[:n].float() - ref).norm() / ref.norm() < 1e-2


@pytest.mark.gpu
def test_it_leaves_its_counters_for_the_next_launch() -> None:
    """Persistent programs claim items from a counter in a device buffer that each launch
    must leave at zero: eager calls and CUDA graph replays, one after another, each write
    every row (a counter left behind would hand the next launch nothing: NaN rows)."""
    from troupe.kernels.prefill_hopper import _sched, prefill_attention_hopper

    if not _sm90():
        pytest.skip("an sm_90 GPU")
    batch = _batch("mixed", 2, 16)
    new_kv = fused_new_kv(batch)
    scale = 1 / math.sqrt(128)
    out = torch.empty_like(batch.q)

    def run() -> None:
        prefill_attention_hopper(
            batch.q, batch.k_cache, batch.v_cache, new_kv, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, scale, out,
        )  # fmt: skip

    ref = _reference(batch, scale)
    graph = torch.cuda.CUDAGraph()
    for step in range(4):
        out.fill_(float("nan"))
        if step == 2:
            with torch.cuda.graph(graph):
                run()
            out.fill_(float("nan"))
        if step >= 2:
            graph.replay()
        else:
            run()
        torch.cuda.synchronize()
        assert not out.isnan().any(), f"step {step}: rows unwritten"
        assert (out.float() - ref).norm() / ref.norm() < 1e-2
        assert _sched(batch.q.device)[:2].tolist() == [0, 0]
