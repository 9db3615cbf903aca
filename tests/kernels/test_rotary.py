"""rotary against the reference, and the cos/sin cache against HF transformers' numbers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from troupe.kernels import reference
from troupe.kernels.ops import KernelOps
from troupe.kernels.rope_cache import build_cos_sin_cache, rope_inv_freq

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_dim", [(2, 2, 8), (6, 2, 16), (9, 3, 64)])
def test_rotary_matches_reference(
    device: str, num_q_heads: int, num_kv_heads: int, head_dim: int, triton_ops: KernelOps
) -> None:
    dtype, bound = (torch.float32, 1e-6) if device == "cpu" else (torch.bfloat16, 1e-2)
    gen = torch.Generator().manual_seed(num_q_heads * 1000 + head_dim)
    num_tokens, max_pos = 13, 200
    cache = build_cos_sin_cache(head_dim, max_pos, 10000.0, None, torch.float32, device)
    positions = torch.randint(1, max_pos, (num_tokens,), generator=gen).to(device)
    q = torch.randn(num_tokens, num_q_heads, head_dim, generator=gen).to(device, dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    q_ref, k_ref = reference.rotary(q.float(), k.float(), positions, cache)
    q_out, k_out = triton_ops.rotary(q.clone(), k.clone(), positions, cache)
    for out, ref in ((q_out, q_ref), (k_out, k_ref)):
        assert out.dtype == dtype
        assert float((out.float() - ref).norm() / ref.norm()) < bound
    # Rotation keeps each pair's norm.
    torch.testing.assert_close(q_out.float().norm(), q.float().norm(), rtol=1e-2, atol=0)


def test_rotary_reference_by_hand() -> None:
    # D = 2: one pair (x1, x2) rotated by angle pos * 1.
    cache = build_cos_sin_cache(2, 4, 10000.0, None, torch.float64, "cpu")
    q = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    q_out, _ = reference.rotary(q, q.clone(), torch.tensor([1]), cache)
    c, s = torch.cos(torch.tensor(1.0)), torch.sin(torch.tensor(1.0))
    torch.testing.assert_close(q_out[0, 0], torch.stack([c, s]).double())


@pytest.mark.parametrize("scaling", [None, LLAMA3], ids=["plain", "llama3"])
def test_cos_sin_cache_matches_transformers(scaling: dict[str, object] | None) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    head_dim, theta = 64, 500000.0
    fields: dict[str, Any] = {"rope_theta": theta, "rope_scaling": scaling}
    config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=131072,
        **fields,  # HF reads these from **kwargs; its stubs do not list them
    )
    got = rope_inv_freq(head_dim, theta, scaling)
    if scaling is None:
        expected = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    else:
        expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if scaling is not None:
        assert not torch.equal(got, rope_inv_freq(head_dim, theta, None))
    cache = build_cos_sin_cache(head_dim, 300, theta, scaling, torch.float32, "cpu")
    angles = torch.arange(300).float()[:, None] * expected[None, :]
    torch.testing.assert_close(cache, torch.cat((angles.cos(), angles.sin()), -1))


def test_cos_sin_cache_rejects_unknown_scaling() -> None:
    with pytest.raises(ValueError, match="yarn"):
        build_cos_sin_cache(8, 4, 1e4, {"rope_type": "yarn", "factor": 2.0}, torch.float32, "cpu")
