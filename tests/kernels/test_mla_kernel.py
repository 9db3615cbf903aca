"""The Triton MLA ops (latent write, absorbed attention over the paged latent cache, split
merge) against kernels/mla_reference.py, under TRITON_INTERPRET=1 on the CPU."""

from __future__ import annotations

import pytest
import torch
from troupe.kernels import mla_reference as ref
from troupe.kernels.arrival import arrival_counters
from troupe.kernels.mla_decode import DEFAULT_CONFIG, MlaLaunch, mla_attention_triton
from troupe.kernels.mla_ops import mla_rows
from troupe.kernels.ops import KernelOps

HEADS, NOPE, ROPE, V, LORA, BS, BLOCKS = 4, 8, 8, 12, 32, 4, 24


def _setup(seq_lens: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A latent cache with the sequences' tokens written in shuffled blocks (NaN elsewhere:
    never read) and their block tables (padding entries point anywhere)."""
    gen = torch.Generator().manual_seed(seed)
    cache = torch.full((BLOCKS, BS, LORA + ROPE), float("nan"))
    order = torch.randperm(BLOCKS, generator=gen).tolist()
    width = max(-(-n // BS) for n in seq_lens) + 1
    table = torch.randint(0, BLOCKS, (len(seq_lens), width), generator=gen, dtype=torch.int32)
    for s, n in enumerate(seq_lens):
        for b in range(-(-n // BS)):
            table[s, b] = order.pop()
        slots = torch.tensor([int(table[s, p // BS]) * BS + p % BS for p in range(n)])
        ref.write_latent(torch.randn(n, LORA, generator=gen), torch.randn(n, ROPE, generator=gen),
                         cache, slots)  # fmt: skip
    kv_b = torch.randn(HEADS * (NOPE + V), LORA, generator=gen) * 0.3
    return cache, table, kv_b


def test_write_latent_skips_padding(triton_ops: KernelOps) -> None:
    gen = torch.Generator().manual_seed(0)
    latent, rope = torch.randn(5, LORA, generator=gen), torch.randn(5, ROPE, generator=gen)
    slots = torch.tensor([3, -1, 17, 0, -1])
    ours = torch.randn(BLOCKS, BS, LORA + ROPE, generator=gen)
    theirs = ours.clone()
    triton_ops.write_latent(latent, rope, ours, slots)
    ref.write_latent(latent, rope, theirs, slots)
    assert torch.equal(ours, theirs)
    assert torch.equal(ours.view(-1, LORA + ROPE)[17], torch.cat([latent[2], rope[2]]))


def test_decode_matches_absorbed_reference(triton_ops: KernelOps) -> None:
    seq_lens = [1, 9, 37, 20]  # 37: two BLOCK_N tiles
    cache, table, kv_b = _setup(seq_lens, seed=1)
    gen = torch.Generator().manual_seed(2)
    q_nope = torch.randn(len(seq_lens), HEADS, NOPE, generator=gen)
    q_rope = torch.randn(len(seq_lens), HEADS, ROPE, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    qsl = torch.arange(len(seq_lens) + 1, dtype=torch.int32)
    args = (q_nope, q_rope, cache, kv_b, table, lens, qsl, V, 0.3)
    out = triton_ops.mla_attention(*args, is_decode=True)
    torch.testing.assert_close(out, ref.mla_attention(*args, is_decode=True))
    # the same rows as a varlen (mixed-step) batch: rows found on the device
    torch.testing.assert_close(triton_ops.mla_attention(*args, is_decode=False), out)


def test_prefill_rows_match_expanded_reference(triton_ops: KernelOps) -> None:
    """Chunked prefill rows (causal within the chunk, the earlier tokens from the cache), a
    decode row, and CUDA-graph padding rows past the last sequence (zeros)."""
    seq_lens = [13, 6, 30]
    q_lens = [5, 6, 1]
    cache, table, kv_b = _setup(seq_lens, seed=3)
    num_rows = sum(q_lens) + 3  # three padding rows
    gen = torch.Generator().manual_seed(4)
    q_nope = torch.randn(num_rows, HEADS, NOPE, generator=gen)
    q_rope = torch.randn(num_rows, HEADS, ROPE, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    qsl = torch.tensor([0, 5, 11, 12], dtype=torch.int32)
    seq, ctx = mla_rows(lens, qsl, num_rows)
    assert seq.tolist() == [0] * 5 + [1] * 6 + [2] * 4
    assert ctx.tolist() == [9, 10, 11, 12, 13, 1, 2, 3, 4, 5, 6, 30, 0, 0, 0]
    args = (q_nope, q_rope, cache, kv_b, table, lens, qsl, V, 0.25)
    out = triton_ops.mla_attention(*args, is_decode=False)
    expected = ref.mla_attention(*args, is_decode=False)
    torch.testing.assert_close(out, expected)
    assert torch.equal(out[12:], torch.zeros_like(out[12:]))


def test_expanded_prefill_matches_reference(triton_ops: KernelOps) -> None:
    """The expanded form (latent blocks decompressed, the paged prefill kernel over them):
    chunks after cached context and a whole prompt; only the sequences' own blocks expanded."""
    seq_lens, q_lens = [13, 6, 9], [5, 6, 2]
    cache, table, kv_b = _setup(seq_lens, seed=8)
    gen = torch.Generator().manual_seed(9)
    q_nope = torch.randn(sum(q_lens), HEADS, NOPE, generator=gen)
    q_rope = torch.randn(sum(q_lens), HEADS, ROPE, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    qsl = torch.tensor([0, 5, 11, 13], dtype=torch.int32)
    # the blocks to expand (a sequence's own, listed in another order) and tables into them
    blocks = torch.cat([table[s, : -(-n // BS)] for s, n in enumerate(seq_lens)]).long()
    order = torch.randperm(len(blocks), generator=gen)
    tables = torch.zeros(3, 4, dtype=torch.int32)  # padding entries: 0
    start = 0
    for s, n in enumerate(seq_lens):
        count = -(-n // BS)
        tables[s, :count] = order.argsort()[start : start + count].int()
        start += count
    args = (q_nope, q_rope, cache, kv_b, blocks[order], tables, lens, qsl, V, 0.25, 6, 13)
    out = triton_ops.mla_prefill(*args)
    assert out.shape == (13, HEADS, V)
    torch.testing.assert_close(out, ref.mla_prefill(*args))
    # the same function as the absorbed form
    absorbed = ref.mla_attention(q_nope, q_rope, cache, kv_b, table, lens, qsl, V, 0.25, False)
    torch.testing.assert_close(out, absorbed)


_CONFIGS = [
    MlaLaunch(block_n=16),  # whole pages: 4 pages of 4 a tile
    MlaLaunch(block_n=2),  # a sub-page tile: one block id a tile
    DEFAULT_CONFIG,  # the engine's (bn 64: 16 pages of 4 a tile)
]


@pytest.mark.parametrize("config", _CONFIGS, ids=str)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_splits_merge_to_the_one_pass_softmax(num_splits: int, config: MlaLaunch) -> None:
    """Every tile form, one pass and split + merge; ctx 0 (a padding row) gives zeros."""
    seq_lens = [40, 3, 17, 0]
    cache, table, _ = _setup(seq_lens, seed=5)
    gen = torch.Generator().manual_seed(6)
    q_lat = torch.randn(4, HEADS, LORA, generator=gen)
    q_rope = torch.randn(4, HEADS, ROPE, generator=gen)
    seq = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    ctx = torch.tensor(seq_lens, dtype=torch.int32)
    out = mla_attention_triton(
        q_lat, q_rope, cache, table, seq, ctx, 0.2, num_splits=num_splits, config=config
    )
    assert torch.equal(out[3], torch.zeros_like(out[3]))
    # the last split of each row set its arrival counter back to 0
    assert not arrival_counters(4, out.device)[:4].any()
    for s, n in enumerate(seq_lens[:3]):
        rows = torch.cat([cache[int(b)] for b in table[s, : -(-n // BS)]])[:n]
        scores = (q_lat[s] @ rows[:, :LORA].T + q_rope[s] @ rows[:, LORA:].T) * 0.2
        torch.testing.assert_close(out[s], scores.softmax(-1) @ rows[:, :LORA])


def test_fused_merge_over_wide_latent_rows() -> None:
    """The rolled merge works in 128-column pieces (2 here): three splits merged by the last
    one, against a torch softmax over the gathered rows."""
    latent, rope, bs, lens = 256, 16, 4, [23, 9]
    gen = torch.Generator().manual_seed(21)
    cache = torch.randn(16, bs, latent + rope, generator=gen)
    table = torch.randperm(16, generator=gen)[:12].view(2, 6).to(torch.int32)
    q_lat = torch.randn(2, HEADS, latent, generator=gen)
    q_rope = torch.randn(2, HEADS, rope, generator=gen)
    config = MlaLaunch(block_n=8)
    seq, ctx = torch.tensor([0, 1], dtype=torch.int32), torch.tensor(lens, dtype=torch.int32)
    out = mla_attention_triton(q_lat, q_rope, cache, table, seq, ctx, 0.1, num_splits=3,
                               config=config)  # fmt: skip
    for s, n in enumerate(lens):
        rows = cache[table[s].long()].flatten(0, 1)[:n]
        scores = (q_lat[s] @ rows[:, :latent].T + q_rope[s] @ rows[:, latent:].T) * 0.1
        torch.testing.assert_close(out[s], scores.softmax(-1) @ rows[:, :latent])


def test_yarn_table_matches_transformers() -> None:
    import transformers
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf
    from troupe.kernels.rope_cache import build_cos_sin_cache

    scaling = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
               "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 32, "beta_slow": 1}  # fmt: skip
    cfg = transformers.DeepseekV3Config(
        qk_rope_head_dim=16, max_position_embeddings=256, rope_scaling=scaling, rope_theta=500.0
    )
    rotary = hf.DeepseekV3RotaryEmbedding(cfg)
    positions = torch.arange(256)[None]
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    table = build_cos_sin_cache(16, 256, 500.0, scaling, torch.float32, "cpu")
    torch.testing.assert_close(table[:, :8], cos[0, :, :8])
    torch.testing.assert_close(table[:, 8:], sin[0, :, :8])
    assert abs(float(cos[0, 0, 0]) - 1.0) > 1e-3  # the attention factor is not 1 here


def _v2_lite_problem(num_seqs: int, context: int, seed: int) -> dict[str, torch.Tensor]:
    """DeepSeek-V2-Lite's MLA shape (16 heads, 512 + 64 latent, nope 128, v 128) in bf16."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = -(-context // 16)
    num_blocks = num_seqs * per_seq + 3
    order = torch.randperm(num_blocks, generator=gen)[: num_seqs * per_seq]
    return {
        "cache": torch.randn(num_blocks, 16, 576, generator=gen).bfloat16().cuda(),
        "table": order.view(num_seqs, per_seq).to(torch.int32).cuda(),
        "q_nope": torch.randn(num_seqs, 16, 128, generator=gen).bfloat16().cuda(),
        "q_rope": torch.randn(num_seqs, 16, 64, generator=gen).bfloat16().cuda(),
        "kv_b": (torch.randn(16 * 256, 512, generator=gen) * 512**-0.5).bfloat16().cuda(),
    }


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_v2_lite_shape_bf16_on_cuda() -> None:
    from troupe.kernels import mla_ops

    p = _v2_lite_problem(num_seqs=8, context=700, seed=7)
    lens = torch.tensor([700, 1, 16, 17, 333, 512, 650, 699], dtype=torch.int32).cuda()
    qsl = torch.arange(9, dtype=torch.int32).cuda()
    args = (p["q_nope"], p["q_rope"], p["cache"], p["kv_b"], p["table"], lens, qsl, 128, 0.07)
    got = mla_ops.mla_attention(*args, is_decode=True).float()
    expected = ref.mla_attention(
        p["q_nope"].float(), p["q_rope"].float(), p["cache"], p["kv_b"].float(), p["table"],
        lens, qsl, 128, 0.07, is_decode=True,
    )  # fmt: skip
    assert float((got - expected).norm() / expected.norm()) < 2e-2


_GPU_CONFIGS = [
    *(c for c in _CONFIGS if c.block_n >= 16),  # tl.dot's smallest tile on the GPU
    MlaLaunch(block_n=32),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("config", _GPU_CONFIGS, ids=str)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_variants_bf16_on_cuda(config: MlaLaunch, num_splits: int) -> None:
    p = _v2_lite_problem(num_seqs=8, context=700, seed=13)
    lens = torch.tensor([700, 1, 16, 17, 333, 512, 650, 699], dtype=torch.int32).cuda()
    w = p["kv_b"].view(16, 256, 512)[:, :128].float()
    q_lat = torch.einsum("shd,hdl->shl", p["q_nope"].float(), w).bfloat16()
    seq = torch.arange(8, dtype=torch.int32).cuda()
    got = mla_attention_triton(q_lat, p["q_rope"], p["cache"], p["table"], seq, lens, 0.07,
                               num_splits=num_splits, config=config).float()  # fmt: skip
    for s, n in enumerate(lens.tolist()):
        rows = torch.cat([p["cache"][int(b)] for b in p["table"][s, : -(-n // 16)]])[:n].float()
        scores = q_lat[s].float() @ rows[:, :512].T + p["q_rope"][s].float() @ rows[:, 512:].T
        expected = (scores * 0.07).softmax(-1) @ rows[:, :512]
        assert float((got[s] - expected).norm() / expected.norm()) < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_replays_in_a_cuda_graph() -> None:
    """Captured once, replayed after the lengths change on the device: the splits follow the
    new lengths, nothing was baked in from the host."""
    from troupe.kernels import mla_ops

    p = _v2_lite_problem(num_seqs=4, context=512, seed=9)
    lens = torch.tensor([100, 200, 300, 400], dtype=torch.int32).cuda()
    qsl = torch.arange(5, dtype=torch.int32).cuda()
    args = (p["q_nope"], p["q_rope"], p["cache"], p["kv_b"], p["table"], lens, qsl, 128, 0.07)
    mla_ops.mla_attention(*args, is_decode=True)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mla_ops.mla_attention(*args, is_decode=True)
    lens.copy_(torch.tensor([512, 3, 250, 77], dtype=torch.int32))
    graph.replay()
    torch.testing.assert_close(out, mla_ops.mla_attention(*args, is_decode=True))
    assert not torch.equal(out[0], out[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_merge_replays_in_a_cuda_graph() -> None:
    """The in-kernel merge's arrival counters are left zeroed by every launch: replays after
    the lengths change on the device give the eager result, and that of one split."""
    p = _v2_lite_problem(num_seqs=4, context=512, seed=15)
    config = MlaLaunch(block_n=64)
    lens = torch.tensor([100, 200, 300, 400], dtype=torch.int32).cuda()
    q_lat = torch.randn(4, 16, 512, device="cuda").bfloat16()
    seq = torch.arange(4, dtype=torch.int32).cuda()
    args = (q_lat, p["q_rope"], p["cache"], p["table"], seq, lens, 0.07)
    mla_attention_triton(*args, num_splits=4, config=config)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mla_attention_triton(*args, num_splits=4, config=config)
    for new in ([512, 3, 250, 77], [1, 512, 0, 129]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.testing.assert_close(out, mla_attention_triton(*args, num_splits=4, config=config))
        eager = mla_attention_triton(*args, num_splits=1, config=config)
        torch.testing.assert_close(out.float(), eager.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_expanded_and_absorbed_prefill_agree_bf16_on_cuda() -> None:
    """DeepSeek-V2-Lite's shape in bf16: prefill chunks after cached context (and a whole
    prompt) through both forms, against each other and the fp32 reference."""
    from troupe.kernels import mla_ops, mla_prefill

    seq_lens, q_lens = [700, 333, 512, 130], [300, 333, 1, 129]
    p = _v2_lite_problem(num_seqs=4, context=700, seed=11)
    gen = torch.Generator().manual_seed(12)
    q_nope = torch.randn(sum(q_lens), 16, 128, generator=gen).bfloat16().cuda()
    q_rope = torch.randn(sum(q_lens), 16, 64, generator=gen).bfloat16().cuda()
    lens = torch.tensor(seq_lens, dtype=torch.int32).cuda()
    qsl = torch.tensor([0, 300, 633, 634, 763], dtype=torch.int32).cuda()
    args = (q_nope, q_rope, p["cache"], p["kv_b"], p["table"], lens, qsl, 128, 0.07)
    blocks = p["table"].flatten().long()  # every entry a sequence's own block here
    tables = torch.arange(blocks.numel(), dtype=torch.int32, device="cuda").view(4, -1)
    expanded = mla_prefill.mla_prefill(
        *args[:4], blocks, tables, *args[5:], max(q_lens), max(seq_lens)
    ).float()
    absorbed = mla_ops.mla_attention(*args, is_decode=False).float()
    expected = ref.mla_attention(
        q_nope.float(), q_rope.float(), p["cache"], p["kv_b"].float(), p["table"], lens, qsl,
        128, 0.07, is_decode=False,
    )  # fmt: skip
    for got in (expanded, absorbed):
        assert float((got - expected).norm() / expected.norm()) < 2e-2
    assert float((expanded - absorbed).norm() / absorbed.norm()) < 2e-2
