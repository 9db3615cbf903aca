"""Mixture of experts in torch: the router's top-k and the experts' SwiGLU, HF's arithmetic.

Expert weights, one tensor each for all experts of a layer (transformers 5's layout):

    w13 [E, 2I, H]   gate rows 0..I-1, up rows I..2I-1
    w2  [E, H, I]    down
    b13 [E, 2I]      optional bias of the gate | up rows (GPT-OSS)
    b2  [E, H]       optional bias of the down output (GPT-OSS)

    gate, up = w13[e, :I] @ x[t] + b13[e, :I],  w13[e, I:] @ x[t] + b13[e, I:]
    out[t]   = sum_k topk_weights[t, k] * (w2[e] @ act(gate, up) + b2[e])
               with e = topk_ids[t, k], act = silu(gate) * up or a ClampedSwiglu
               (kernels/clamped_swiglu.py), absent biases zero

The reference runs one GEMM pair per expert that any token picked, ascending expert id, adding
into a zero output like transformers' Qwen3MoeExperts and GptOssExperts (biases added after
each GEMM), so a CPU model is token-identical to them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .clamped_swiglu import ClampedSwiglu
from .mxfp4 import Mxfp4Experts


def route_topk(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] in the logits' dtype, expert ids [T, k] int64): softmax over every
    expert in fp32, its top-k, divided by their sum when renormalize (norm_topk_prob)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor | Mxfp4Experts,
    w2: torch.Tensor | Mxfp4Experts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    b13: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    clamped: ClampedSwiglu | None = None,
) -> torch.Tensor:
    """The experts' weighted sum [T, H] for x [T, H] routed by topk_ids / topk_weights [T, k],
    with the optional biases b13 [E, 2I], b2 [E, H] and clamped activation."""
    out = torch.zeros_like(x)
    inter = w13.shape[1] // 2
    for expert in torch.unique(topk_ids).tolist():
        token, slot = torch.where(topk_ids == expert)
        gate_up = F.linear(x[token], _expert(w13, expert, x.dtype))
        if b13 is not None:
            gate_up = gate_up + b13[expert]
        gate, up = gate_up[:, :inter], gate_up[:, inter:]
        act = F.silu(gate) * up if clamped is None else clamped(gate, up)
        y = F.linear(act, _expert(w2, expert, x.dtype))
        if b2 is not None:
            y = y + b2[expert]
        y = y * topk_weights[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


def _expert(weights: torch.Tensor | Mxfp4Experts, index: int, dtype: torch.dtype) -> torch.Tensor:
    """One expert's dense matrix (MXFP4 unpacked into `dtype`)."""
    if isinstance(weights, Mxfp4Experts):
        return weights.expert(index, dtype)
    return weights[index]
