"""GPT-OSS's experts: the reference's biases and clamped SwiGLU against transformers'
GptOssExperts, and every fused-MoE kernel variant (under the interpreter) against the
reference."""

from __future__ import annotations

import pytest
import torch
from troupe.kernels.clamped_swiglu import ClampedSwiglu
from troupe.kernels.moe_config import MoeKernelConfig, MoeVariant
from troupe.kernels.moe_reference import fused_moe, route_topk

CLAMPED = ClampedSwiglu(alpha=1.702, limit=7.0)
UNCLAMPED = ClampedSwiglu(alpha=1.702, limit=1e9)


def _problem(tokens: int, experts: int, top_k: int, hidden: int, inter: int, seed: int):
    """x, our-layout weights and biases, routing: gate and up spread to about +-20, so the
    limit 7 clamps a good part of them and leaves the rest."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * 6 * hidden**-0.5
    b13 = torch.randn(experts, 2 * inter, generator=gen) * 2
    w2 = torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5
    b2 = torch.randn(experts, hidden, generator=gen)
    weights, ids = route_topk(torch.randn(tokens, experts, generator=gen), top_k, True)
    return x, w13, b13, w2, b2, weights, ids


def _gate_up(x: torch.Tensor, w13: torch.Tensor, b13: torch.Tensor) -> torch.Tensor:
    """Every expert's gate | up for every token [T, E, 2I]."""
    return torch.einsum("th,eoh->teo", x, w13) + b13


def test_reference_is_transformers_gpt_oss_experts() -> None:
    """Our layout (w13 gate rows then up rows [E, 2I, H], w2 [E, H, I]) through the reference
    gives transformers' GptOssExperts on its interleaved [E, H, 2I] weights."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    experts, hidden, inter = 4, 32, 24
    config = GptOssConfig(
        hidden_size=hidden, intermediate_size=inter, num_local_experts=experts,
        num_experts_per_tok=2, swiglu_limit=CLAMPED.limit,
    )  # fmt: skip
    config._experts_implementation = "eager"
    module = GptOssExperts(config)
    assert (module.alpha, module.limit) == (CLAMPED.alpha, CLAMPED.limit)
    x, w13, b13, w2, b2, weights, ids = _problem(7, experts, 2, hidden, inter, seed=0)
    gate_up = torch.empty(experts, hidden, 2 * inter)
    gate_up[..., ::2], gate_up[..., 1::2] = w13[:, :inter].mT, w13[:, inter:].mT
    gate_up_bias = torch.empty(experts, 2 * inter)
    gate_up_bias[:, ::2], gate_up_bias[:, 1::2] = b13[:, :inter], b13[:, inter:]
    with torch.no_grad():
        module.gate_up_proj.copy_(gate_up)
        module.gate_up_proj_bias.copy_(gate_up_bias)
        module.down_proj.copy_(w2.mT)
        module.down_proj_bias.copy_(b2)
        expected = module(x, router_indices=ids, routing_weights=weights)
    got = fused_moe(x, w13, w2, weights, ids, b13=b13, b2=b2, clamped=CLAMPED)
    torch.testing.assert_close(got, expected)
    without_clamp = fused_moe(x, w13, w2, weights, ids, b13=b13, b2=b2, clamped=UNCLAMPED)
    assert not torch.allclose(without_clamp, expected, rtol=1e-2, atol=1e-2)


FUSED, SPLIT = MoeVariant.FUSED, MoeVariant.SPLIT_K
VARIANTS = [
    MoeKernelConfig(FUSED, block_m=16, block_n=16, block_k=16),
    MoeKernelConfig(FUSED, block_m=16, block_n=16, block_k=16, swap_ab=True),
    MoeKernelConfig(FUSED, block_m=16, block_n=16, block_k=16, atomic_reduce=True),
    MoeKernelConfig(
        FUSED, block_m=16, block_n=16, block_k=16, group_m=2, atomic_reduce=True, swap_ab=True
    ),
    MoeKernelConfig(SPLIT, block_m=16, block_n=16, block_k=16, split_k=3),
    MoeKernelConfig(SPLIT, block_m=16, block_n=16, block_k=16, split_k=2, swap_ab=True),
    MoeKernelConfig(SPLIT, block_m=16, block_n=16, block_k=16, group_m=2, split_k=1),
]


@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: f"{c.variant.value} {c.label()}")
def test_every_variant_matches_reference_with_biases_and_clamp(config: MoeKernelConfig) -> None:
    """Ragged N (I 24 over 16-wide tiles), an empty K slice (split_k 3 of H 32), padding rows;
    gate and up past the limit, so a kernel without the clamp or adding a bias once per K
    slice would fail."""
    from troupe.kernels.fused_moe import fused_moe_triton

    x, w13, b13, w2, b2, weights, ids = _problem(5, 4, 2, 32, 24, seed=1)
    gate_up = _gate_up(x, w13, b13)
    assert 0.2 < (gate_up.abs() > CLAMPED.limit).float().mean() < 0.8
    expected = fused_moe(x, w13, w2, weights, ids, b13=b13, b2=b2, clamped=CLAMPED)
    unclamped = fused_moe(x, w13, w2, weights, ids, b13=b13, b2=b2, clamped=UNCLAMPED)
    assert not torch.allclose(unclamped, expected, rtol=1e-2, atol=1e-2)
    got = fused_moe_triton(x, w13, w2, weights, ids, config=config, b13=b13, b2=b2, clamped=CLAMPED)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("config", [VARIANTS[1], VARIANTS[4]], ids=["fused swap", "split_k 3"])
def test_each_bias_and_the_clamp_apply_on_their_own(config: MoeKernelConfig) -> None:
    """b13 alone with SiLU, b2 alone with the clamp: each flag works without the others."""
    from troupe.kernels.fused_moe import fused_moe_triton

    x, w13, b13, w2, b2, weights, ids = _problem(5, 4, 2, 32, 24, seed=2)
    for kwargs in ({"b13": b13}, {"b2": b2, "clamped": CLAMPED}):
        expected = fused_moe(x, w13, w2, weights, ids, **kwargs)
        got = fused_moe_triton(x, w13, w2, weights, ids, config=config, **kwargs)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: f"{c.variant.value} {c.label()}")
def test_every_variant_bf16_on_cuda(config: MoeKernelConfig) -> None:
    from troupe.kernels.fused_moe import fused_moe_triton

    x, w13, b13, w2, b2, weights, ids = _problem(300, 16, 4, 256, 192, seed=3)
    args = [t.cuda().bfloat16() for t in (x, w13, w2, weights)]
    biases = {"b13": b13.cuda().bfloat16(), "b2": b2.cuda().bfloat16()}
    got = fused_moe_triton(*args, ids.cuda(), config=config, clamped=CLAMPED, **biases).float()
    fp32 = {name: t.float() for name, t in biases.items()}
    expected = fused_moe(*[a.float() for a in args], ids.cuda(), clamped=CLAMPED, **fp32)
    scale = expected.abs().mean().item()
    torch.testing.assert_close(got, expected, rtol=3e-2, atol=3e-2 * scale)
