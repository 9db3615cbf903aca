"""prepare_qkv (q/k norm + rotary + KV write in one kernel) against the composed reference.

CPU: fp32, tiny shapes, Triton under TRITON_INTERPRET=1.
GPU (-m gpu): bf16, real head counts, bf16 error bound. Caches start as NaN, so a slot written
that should not be (slot -1, or a wrong offset) or one left unwritten fails.
"""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import torch
from troupe.kernels import reference
from troupe.kernels.qkv_prepare import prepare_qkv_triton
from troupe.kernels.rope_cache import build_cos_sin_cache

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# (num_kv_heads, num_tokens, block_size, dtype, bound on ||out - ref|| / ||ref||)
SETUP = {
    "cpu": (1, 5, 4, torch.float32, 1e-5),
    "cuda": (8, 300, 16, torch.bfloat16, 1e-2),
}
MAX_POS = 4096


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any(), "output has NaN: unwritten elements or a stray read"
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def _inputs(
    device: str, group: int, head_dim: int, with_norm: bool
) -> tuple[dict[str, Any], torch.Tensor, int]:
    """Random qkv (a strided view), norm weights, positions, NaN caches and slots (some -1)."""
    num_kv_heads, num_tokens, block_size, dtype, _ = SETUP[device]
    gen = torch.Generator().manual_seed(zlib.crc32(repr((device, group, head_dim)).encode()))
    width = (group + 2) * num_kv_heads * head_dim
    # Three extra columns: rows are not packed, so the kernel must honour stride(0).
    base = torch.randn(num_tokens, width + 3, generator=gen) * 2 + 0.3
    qkv = base.to(device, dtype)[:, :width]
    num_slots = 2 * num_tokens + block_size
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    slots[[1, num_tokens - 1]] = -1  # padding tokens: q computed, KV not stored
    cache_shape = (num_slots // block_size + 1, block_size, num_kv_heads, head_dim)

    def weight() -> torch.Tensor | None:
        w = torch.randn(head_dim, generator=gen) * 0.5 + 1.0
        return w.to(device, dtype) if with_norm else None

    args: dict[str, Any] = {
        "qkv": qkv,
        "q_norm_weight": weight(),
        "k_norm_weight": weight(),
        "positions": torch.randint(0, MAX_POS, (num_tokens,), generator=gen).to(device),
        "cos_sin_cache": build_cos_sin_cache(head_dim, MAX_POS, 1e6, None, torch.float32, device),
        "k_cache": torch.full(cache_shape, float("nan"), dtype=dtype, device=device),
        "v_cache": torch.full(cache_shape, float("nan"), dtype=dtype, device=device),
        "slot_mapping": slots.to(device),
    }
    return args, slots, group * num_kv_heads


def _as_float(args: dict[str, Any]) -> dict[str, Any]:
    """fp32 copies for the reference; caches cloned so both sides start from the same NaNs."""
    out: dict[str, Any] = {}
    for name, t in args.items():
        out[name] = None if t is None else (t.float() if t.is_floating_point() else t).clone()
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_norm", [True, False], ids=["qk_norm", "no_norm"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_prepare_qkv_matches_reference(
    device: str, group: int, head_dim: int, with_norm: bool
) -> None:
    bound = SETUP[device][4]
    args, slots, num_q_heads = _inputs(device, group, head_dim, with_norm)
    ref_args = _as_float(args)

    q = prepare_qkv_triton(eps=1e-6, **args)
    q_ref = reference.prepare_qkv(eps=1e-6, **ref_args)

    num_tokens = args["qkv"].shape[0]
    assert q.shape == (num_tokens, num_q_heads, head_dim) and q.is_contiguous()
    assert q.dtype == args["qkv"].dtype
    assert _rel_err(q, q_ref) < bound
    written = slots[slots >= 0].to(q.device)
    for name in ("k_cache", "v_cache"):
        flat_got, flat_ref = args[name].flatten(0, 1), ref_args[name].flatten(0, 1)
        assert _rel_err(flat_got[written], flat_ref[written]) < bound
        # Every other slot is still NaN: nothing was stored for slot -1 or out of place.
        assert flat_got.isnan().all(dim=(1, 2)).sum() == flat_got.shape[0] - written.numel()
    # v is copied, not transformed: exact, token by token.
    v_size = args["k_cache"].shape[2] * head_dim
    token = int((slots >= 0).nonzero()[0])
    slot = int(slots[token])
    v_row = args["qkv"][token, -v_size:]
    torch.testing.assert_close(args["v_cache"].flatten(0, 1)[slot].flatten(), v_row, rtol=0, atol=0)


def test_reference_by_hand() -> None:
    # One token, Hq = Hkv = 1, D = 2, position 1: q = [3, 4] normalised by rms 5/sqrt(2) with
    # weight [2, 1] -> [1.2*sqrt(2), 0.8*sqrt(2)], then rotated by angle 1.
    cache = build_cos_sin_cache(2, 4, 10000.0, None, torch.float64, "cpu")
    qkv = torch.tensor([[3.0, 4.0, 1.0, 0.0, 7.0, 8.0]], dtype=torch.float64)
    k_cache = torch.full((2, 2, 1, 2), float("nan"), dtype=torch.float64)
    v_cache = k_cache.clone()
    w = torch.tensor([2.0, 1.0], dtype=torch.float64)
    q = reference.prepare_qkv(
        qkv, w, w, 0.0, torch.tensor([1]), cache, k_cache, v_cache, torch.tensor([2])
    )
    c, s = torch.cos(torch.tensor(1.0)).item(), torch.sin(torch.tensor(1.0)).item()
    x1, x2 = 1.2 * 2**0.5, 0.8 * 2**0.5
    torch.testing.assert_close(q[0, 0], torch.tensor([x1 * c - x2 * s, x2 * c + x1 * s]).double())
    # k = [1, 0]: rms 1/sqrt(2), weighted -> [2*sqrt(2), 0], rotated.
    k1 = 2 * 2**0.5
    torch.testing.assert_close(k_cache[1, 0, 0], torch.tensor([k1 * c, k1 * s]).double())
    assert v_cache[1, 0, 0].tolist() == [7.0, 8.0]
    assert k_cache[0].isnan().all() and k_cache[1, 1].isnan().all()
