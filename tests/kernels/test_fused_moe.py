"""The fused Triton MoE kernel (under the interpreter) against the torch reference, and the
expert sort it runs on."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from troupe.kernels import moe_config
from troupe.kernels.moe_align import moe_align, padded_rows
from troupe.kernels.moe_config import MoeKernelConfig, MoeVariant, config_for
from troupe.kernels.moe_reference import fused_moe, route_topk
from troupe.kernels.ops import KernelOps


def _problem(tokens: int, experts: int, top_k: int, hidden: int, inter: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5
    router = torch.randn(tokens, experts, generator=gen)
    weights, ids = route_topk(router, top_k, renormalize=True)
    return x, w13, w2, weights, ids


def test_align_groups_rows_by_expert_with_padding() -> None:
    ids = torch.tensor([[3, 0], [3, 1], [0, 3]])  # expert 2 unused
    rows, block_expert = moe_align(ids, num_experts=4, block_m=2)
    assert rows.numel() == padded_rows(6, 4, 2) == 10
    sentinel = 6
    # expert 0: rows 1, 4; expert 1: row 3 + pad; expert 3: rows 0, 2, 5 + pad
    assert rows.tolist()[:8] == [1, 4, 3, sentinel, 0, 2, 5, sentinel]
    assert set(rows.tolist()[8:]) == {sentinel}
    assert block_expert.tolist() == [0, 1, 3, 3, -1]


@pytest.mark.parametrize(("tokens", "experts", "top_k", "block_m"), [(3, 4, 2, 2), (37, 8, 2, 16)])
def test_triton_align_matches_torch(tokens: int, experts: int, top_k: int, block_m: int) -> None:
    from troupe.kernels.moe_align_triton import moe_align_triton

    gen = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    want_rows, want_blocks = moe_align(ids, experts, block_m)
    got_rows, got_blocks = moe_align_triton(ids, experts, block_m)
    assert got_rows.tolist() == want_rows.tolist()
    assert got_blocks.tolist() == want_blocks.tolist()


def test_reference_is_the_per_token_sum() -> None:
    x, w13, w2, weights, ids = _problem(5, 6, 3, 16, 8, seed=0)
    expected = torch.zeros_like(x)
    for t in range(5):
        for slot in range(3):
            e = int(ids[t, slot])
            gate, up = (w13[e] @ x[t]).chunk(2)
            expected[t] += weights[t, slot] * (w2[e] @ (F.silu(gate) * up))
    torch.testing.assert_close(fused_moe(x, w13, w2, weights, ids), expected)
    assert torch.allclose(weights.sum(-1), torch.ones(5))


@pytest.mark.parametrize(
    ("tokens", "hidden", "inter", "block_m"),
    [(1, 64, 32, None), (7, 80, 48, 16), (37, 64, 96, 32)],  # decode, ragged K/N, prefill
)
def test_kernel_matches_reference(
    triton_ops: KernelOps, tokens: int, hidden: int, inter: int, block_m: int | None
) -> None:
    from troupe.kernels.fused_moe import fused_moe_triton

    x, w13, w2, weights, ids = _problem(tokens, 8, 2, hidden, inter, seed=tokens)
    expected = fused_moe(x, w13, w2, weights, ids)
    if block_m is None:
        got = triton_ops.fused_moe(x, w13, w2, weights, ids)  # through the dispatcher
    else:
        config = MoeKernelConfig(block_m=block_m, block_n=32, block_k=32)
        got = fused_moe_triton(x, w13, w2, weights, ids, config=config)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


FUSED, SPLIT = MoeVariant.FUSED, MoeVariant.SPLIT_K
VARIANTS = [
    MoeKernelConfig(FUSED, block_m=16, block_n=32, block_k=32, group_m=3),
    MoeKernelConfig(FUSED, block_m=16, block_n=16, block_k=32, group_m=1),
    MoeKernelConfig(FUSED, block_m=16, block_n=32, block_k=32, atomic_reduce=True),
    MoeKernelConfig(FUSED, block_m=32, block_n=32, block_k=16, group_m=2, atomic_reduce=True),
    MoeKernelConfig(FUSED, block_m=16, block_n=32, block_k=32, swap_ab=True),
    MoeKernelConfig(
        FUSED, block_m=32, block_n=16, block_k=16, group_m=2, atomic_reduce=True, swap_ab=True
    ),
    MoeKernelConfig(SPLIT, block_m=16, block_n=32, block_k=16, split_k=3, triton_align=True),
    MoeKernelConfig(SPLIT, block_m=16, block_n=32, block_k=16, split_k=2, swap_ab=True),
    MoeKernelConfig(SPLIT, block_m=16, block_n=32, block_k=32, group_m=2, split_k=1),
]


@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: f"{c.variant.value} {c.label()}")
def test_every_variant_matches_reference(config: MoeKernelConfig) -> None:
    """Each variant on ragged K (80) and N (48), 23 tokens over 8 experts: several row blocks
    per expert, partial groups and K slices, padding rows."""
    from troupe.kernels.fused_moe import fused_moe_triton

    x, w13, w2, weights, ids = _problem(23, 8, 2, 80, 48, seed=5)
    expected = fused_moe(x, w13, w2, weights, ids)
    got = fused_moe_triton(x, w13, w2, weights, ids, config=config)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_config_names_the_bad_field_and_picks_by_size() -> None:
    with pytest.raises(ValueError, match="block_n"):
        MoeKernelConfig(block_n=48)
    with pytest.raises(ValueError, match="split_k"):
        MoeKernelConfig(SPLIT, split_k=0)
    with pytest.raises(ValueError, match="split_k"):
        MoeKernelConfig(FUSED, split_k=2)
    split = MoeKernelConfig(SPLIT, block_m=16, split_k=4, swap_ab=True)
    assert moe_config.config_source(split) == (
        "MoeKernelConfig(MoeVariant.SPLIT_K, block_m=16, split_k=4, swap_ab=True)"
    )
    assert eval(moe_config.config_source(split), vars(moe_config)) == split
    assert config_for(256 * 6, 64) is moe_config.DECODE_CONFIG
    assert config_for(16384 * 6, 64) is moe_config.PREFILL_CONFIG


def test_default_tiles_fit_shared_memory_in_fp32() -> None:
    """The defaults were swept in bf16; fp32 inputs get fewer stages, never an out-of-resources
    launch (the CUDA tests against HF run the model in fp32)."""
    for rows in (256 * 6, 16384 * 6):
        bf16, fp32 = config_for(rows, 64), config_for(rows, 64, elem_size=4)
        bm = bf16.block_m or moe_config.block_m_for(rows, 64)
        assert moe_config.shared_bytes(bf16, bm, 2) <= moe_config.SHARED_MEMORY_BUDGET
        assert moe_config.shared_bytes(fp32, bm, 4) <= moe_config.SHARED_MEMORY_BUDGET
        assert fp32.block_n == bf16.block_n and fp32.swap_ab == bf16.swap_ab
    assert config_for(256 * 6, 64, elem_size=4).num_stages < moe_config.DECODE_CONFIG.num_stages


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [1, 256, 2048])
def test_kernel_bf16_on_cuda(tokens: int) -> None:
    from troupe.kernels.fused_moe import fused_moe_triton

    x, w13, w2, weights, ids = _problem(tokens, 64, 6, 2048, 1408, seed=1)
    args = [t.cuda().bfloat16() for t in (x, w13, w2, weights)]
    got = fused_moe_triton(*args, ids.cuda()).float()
    expected = fused_moe(*[a.float() for a in args], ids.cuda())
    torch.testing.assert_close(got, expected, rtol=3e-2, atol=3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_replays_in_a_cuda_graph() -> None:
    """Sort, grids and kernels are shape-only: a captured call replays new routings."""
    from troupe.kernels.fused_moe import fused_moe_triton

    x, w13, w2, weights, ids = (t.cuda() for t in _problem(64, 16, 4, 256, 128, seed=2))
    static = [x.clone(), weights.clone(), ids.clone()]
    fused_moe_triton(static[0], w13, w2, static[1], static[2])  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe_triton(static[0], w13, w2, static[1], static[2])
    x2, _, _, weights2, ids2 = (t.cuda() for t in _problem(64, 16, 4, 256, 128, seed=3))
    for tensor, new in zip(static, (x2, weights2, ids2), strict=True):
        tensor.copy_(new)
    graph.replay()
    expected = fused_moe(x2, w13, w2, weights2, ids2)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: f"{c.variant.value} {c.label()}")
def test_every_variant_bf16_on_cuda(config: MoeKernelConfig) -> None:
    from troupe.kernels.fused_moe import fused_moe_triton

    x, w13, w2, weights, ids = _problem(300, 16, 4, 256, 192, seed=4)
    args = [t.cuda().bfloat16() for t in (x, w13, w2, weights)]
    got = fused_moe_triton(*args, ids.cuda(), config=config).float()
    expected = fused_moe(*[a.float() for a in args], ids.cuda())
    torch.testing.assert_close(got, expected, rtol=3e-2, atol=3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "block_m"), [(256, 64, 6, 64), (512, 128, 8, 16)]
)
def test_triton_align_matches_torch_on_cuda(
    tokens: int, experts: int, top_k: int, block_m: int
) -> None:
    from troupe.kernels.moe_align_triton import moe_align_triton

    ids = torch.randn(tokens, experts, device="cuda").topk(top_k, dim=-1).indices
    want_rows, want_blocks = moe_align(ids, experts, block_m)
    got_rows, got_blocks = moe_align_triton(ids, experts, block_m)
    assert torch.equal(got_rows, want_rows)
    assert torch.equal(got_blocks, want_blocks)


def test_the_engine_path_runs_the_default_config(
    triton_ops: KernelOps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ops.fused_moe (what the MoE layers call) takes moe_config.DECODE_CONFIG at decode sizes:
    flipping that one constant switches the engine's kernel."""
    from troupe.kernels import fused_moe as fused_moe_module

    calls: list[MoeKernelConfig] = []
    real = fused_moe_module.fused_moe_split_k

    def spy(*args: object) -> torch.Tensor:
        calls.append(args[-1])  # type: ignore[arg-type]
        return real(*args)  # type: ignore[arg-type]

    split = MoeKernelConfig(SPLIT, block_m=16, block_n=32, block_k=32, split_k=2)
    monkeypatch.setattr(moe_config, "DECODE_CONFIG", split)
    monkeypatch.setattr(fused_moe_module, "fused_moe_split_k", spy)
    x, w13, w2, weights, ids = _problem(5, 8, 2, 64, 32, seed=6)
    got = triton_ops.fused_moe(x, w13, w2, weights, ids)
    assert calls == [split]
    torch.testing.assert_close(got, fused_moe(x, w13, w2, weights, ids), rtol=1e-4, atol=1e-4)
