"""MXFP4 experts kept packed (kernels/mxfp4.py): unpacking equals transformers' own
dequantization for every byte, the torch reference over packed experts equals it over their
unpacked weights, and the Triton GEMMs (kernels/fused_moe_mxfp4.py; the interpreter here)
equal the reference, with and without GPT-OSS's biases and clamp, atomic or not."""

from __future__ import annotations

import pytest
import torch
from troupe.kernels.clamped_swiglu import ClampedSwiglu
from troupe.kernels.fused_moe import fused_moe_triton
from troupe.kernels.moe_config import MoeKernelConfig, MoeVariant
from troupe.kernels.moe_reference import fused_moe, route_topk
from troupe.kernels.mxfp4 import Mxfp4Experts, unpack

E, H, INTER, T, K = 4, 64, 96, 5, 2
F = MoeVariant.FUSED
CONFIGS = [
    MoeKernelConfig(F, 16, 32, 32, num_warps=4, num_stages=1),
    MoeKernelConfig(F, 16, 64, 64, num_warps=4, num_stages=1, atomic_reduce=True),
    MoeKernelConfig(F, 16, 32, 16, num_warps=4, num_stages=1, group_m=2),  # block_k 16 -> 32
    MoeKernelConfig(MoeVariant.SPLIT_K, 16, 32, 32, num_warps=4, num_stages=1, split_k=2),
]


def _packed(e: int, n: int, k: int, gen: torch.Generator, device: str) -> Mxfp4Experts:
    blocks = torch.randint(0, 256, (e, n, k // 2), generator=gen, dtype=torch.uint8)
    scales = torch.randint(121, 126, (e, n, k // 32), generator=gen, dtype=torch.uint8)
    return Mxfp4Experts(blocks.to(device), scales.to(device))


def _case(device: str, dtype: torch.dtype, tokens: int = T, experts: int = E, top_k: int = K):
    gen = torch.Generator().manual_seed(0)
    w13, w2 = _packed(experts, 2 * INTER, H, gen, device), _packed(experts, H, INTER, gen, device)
    x = torch.randn(tokens, H, generator=gen).to(device, dtype)
    weights, ids = route_topk(
        torch.randn(tokens, experts, generator=gen).to(device, dtype), top_k, True
    )
    extras = {
        "b13": (torch.randn(experts, 2 * INTER, generator=gen) * 0.5).to(device, dtype),
        "b2": (torch.randn(experts, H, generator=gen) * 0.5).to(device, dtype),
        "clamped": ClampedSwiglu(limit=1.5),
    }
    return x, w13, w2, weights, ids, extras


def _dense(w: Mxfp4Experts, dtype: torch.dtype) -> torch.Tensor:
    return unpack(w.blocks, w.scales).to(dtype)


def test_unpack_equals_transformers_for_every_byte() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 16, 16).repeat(2, 3, 1, 1)
    scales = torch.tensor([0, 1, 100, 126, 127, 128, 200, 254], dtype=torch.uint8)
    scales = scales.repeat(2, 3, 2)  # [E=2, N=3, G=16]
    got = unpack(blocks.flatten(-2), scales)
    assert torch.equal(got, convert_moe_packed_tensors(blocks, scales).transpose(1, 2))
    with pytest.raises(ValueError, match="scales"):
        Mxfp4Experts(blocks.flatten(-2), scales[..., :3])


@pytest.mark.parametrize("gpt_oss", [False, True])
def test_reference_over_packed_experts_equals_unpacked(gpt_oss: bool) -> None:
    x, w13, w2, weights, ids, extras = _case("cpu", torch.float32)
    extras = extras if gpt_oss else {}
    packed = fused_moe(x, w13, w2, weights, ids, **extras)
    dense = fused_moe(x, _dense(w13, x.dtype), _dense(w2, x.dtype), weights, ids, **extras)
    assert torch.equal(packed, dense)


@pytest.mark.parametrize("gpt_oss", [False, True])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.label())
def test_triton_equals_the_reference(config: MoeKernelConfig, gpt_oss: bool) -> None:
    x, w13, w2, weights, ids, extras = _case("cpu", torch.float32)
    extras = extras if gpt_oss else {}
    expected = fused_moe(x, w13, w2, weights, ids, **extras)
    got = fused_moe_triton(x, w13, w2, weights, ids, config=config, **extras)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
    if gpt_oss:  # the clamp binds for these weights
        plain = fused_moe(x, w13, w2, weights, ids, b13=extras["b13"], b2=extras["b2"])
        assert (plain - expected).abs().max() > 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [7, 300])
def test_cuda_bf16_equals_the_reference(tokens: int) -> None:
    """bf16 on CUDA at the engine's default configs (decode and prefill sizes), GPT-OSS's
    biases and clamp included, against the fp32 reference over the same packed weights."""
    x, w13, w2, weights, ids, extras = _case("cuda", torch.bfloat16, tokens, experts=16, top_k=4)
    got = fused_moe_triton(x, w13, w2, weights, ids, **extras)
    f32 = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in extras.items()}
    expected = fused_moe(x.float(), w13, w2, weights.float(), ids, **f32)
    err = (got.float() - expected).norm() / expected.norm()
    assert err < 2e-2
