"""MXFP4 experts kept packed (kernels/mxfp4.py): unpacking equals transformers' own
dequantization for every byte, the torch reference over packed experts equals it over their
unpacked weights, the Triton GEMMs' in-register unpacking (bits, no exp2) gives the same value
for every code and exponent, and the Triton GEMMs (kernels/fused_moe_mxfp4.py; the interpreter
here) equal the reference, with and without GPT-OSS's biases and clamp, atomic or not."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from troupe.kernels.clamped_swiglu import ClampedSwiglu
from troupe.kernels.fused_moe import fused_moe_triton
from troupe.kernels.fused_moe_mxfp4 import UNPACK_ROWS, e2m1, e8m0, unpack_experts
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


@pytest.mark.parametrize("gpt_oss", [False, True])
def test_enough_rows_unpack_once_for_the_dense_gemms(gpt_oss: bool) -> None:
    tokens = UNPACK_ROWS * E // K + 1  # past the threshold: unpacked, then kernels/fused_moe.py
    x, w13, w2, weights, ids, extras = _case("cpu", torch.float32, tokens)
    extras = extras if gpt_oss else {}
    expected = fused_moe(x, w13, w2, weights, ids, **extras)
    got = fused_moe_triton(x, w13, w2, weights, ids, config=CONFIGS[0], **extras)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unpack_experts_equals_unpack(dtype: torch.dtype) -> None:
    """The Triton unpacking (one program past the last byte: masked) of every byte under
    exponents from 0 to 254. In bf16 from exponent 2: the interpreter's cast to bf16 loses
    subnormals (0.5 * 2^-126 and below), which no real checkpoint's exponent comes near."""
    blocks = torch.arange(256, dtype=torch.uint8).repeat(3, 5, 2)  # [E=3, N=5, K/2=512]
    low = 0 if dtype == torch.float32 else 2
    scales = torch.tensor([low, 3, 100, 126, 127, 128, 200, 254], dtype=torch.uint8)
    w = Mxfp4Experts(blocks, scales.repeat(3, 5, 4))  # [E, N, K/32=32]
    got = unpack_experts(w, dtype)
    want = unpack(w.blocks, w.scales).to(dtype)
    assert got.shape == want.shape and torch.equal(got.view(-1), want.view(-1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [7, 300])
def test_cuda_bf16_equals_the_reference(tokens: int) -> None:
    """bf16 on CUDA at the engine's default configs (decode and prefill sizes: packed, and
    unpacked once), GPT-OSS's biases and clamp included, against the fp32 reference over the
    same packed weights."""
    x, w13, w2, weights, ids, extras = _case("cuda", torch.bfloat16, tokens, experts=16, top_k=4)
    got = fused_moe_triton(x, w13, w2, weights, ids, **extras)
    f32 = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in extras.items()}
    expected = fused_moe(x.float(), w13, w2, weights.float(), ids, **f32)
    err = (got.float() - expected).norm() / expected.norm()
    assert err < 2e-2


@triton.jit
def _values_kernel(codes_ptr, exponents_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    codes = tl.load(codes_ptr + offs)
    exponents = tl.load(exponents_ptr + offs)
    tl.store(out_ptr + offs, e2m1(codes) * e8m0(exponents))


def test_register_unpacking_matches_for_every_code_and_exponent() -> None:
    """Each of the 16 codes times each exponent 0..254 (fp32, then bf16 as the GEMMs cast it)
    equals kernels/mxfp4.unpack's value."""
    codes = torch.arange(16, dtype=torch.int32).repeat(255)
    exponents = torch.arange(255, dtype=torch.int32).repeat_interleave(16)
    size = triton.next_power_of_2(codes.numel())
    out = torch.zeros(size, dtype=torch.float32)
    pad = size - codes.numel()
    _values_kernel[(1,)](
        torch.nn.functional.pad(codes, (0, pad)),
        torch.nn.functional.pad(exponents, (0, pad), value=127),
        out,
        BLOCK=size,
    )
    got = out[: codes.numel()].to(torch.bfloat16).reshape(255, 16)
    blocks = (torch.arange(0, 16, 2) | (torch.arange(1, 16, 2) << 4)).to(torch.uint8)
    want = unpack(blocks.repeat(255, 4), torch.arange(255, dtype=torch.uint8)[:, None])[:, :16]
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
