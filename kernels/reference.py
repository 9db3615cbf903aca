"""Torch references for every kernel: slow, plain, and obviously right.

They run on any device, compute in fp32 and return the input dtype. The Triton kernels are tested
against these; `kernels.ops` falls back to them off CUDA.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def write_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter key/value [N, Hkv, D] into the caches at slot_mapping [N]; slot < 0 is skipped."""
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = key[keep].to(k_cache.dtype)
    v_cache[blocks, offsets] = value[keep].to(v_cache.dtype)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first seq_len tokens of one sequence's cache, as [seq_len, Hkv, D]."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]  # [nb, bs, Hkv, D]
    return blocks.reshape(-1, *cache.shape[2:])[:seq_len]


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Varlen causal attention over paged KV; see kernels.ops.paged_attention for the contract."""
    num_q_heads = q.shape[1]
    out = torch.empty_like(q)
    for s in range(seq_lens.shape[0]):
        start, end = int(query_start_loc[s]), int(query_start_loc[s + 1])
        seq_len, q_len = int(seq_lens[s]), end - start
        if q_len == 0:
            continue
        k = gather_kv(k_cache, block_tables[s], seq_len).float()  # [L, Hkv, D]
        v = gather_kv(v_cache, block_tables[s], seq_len).float()
        group = num_q_heads // k.shape[1]
        k = k.repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:end].float(), k) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        causal = k_pos[None, :] <= q_pos[:, None]  # [q_len, L]
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per sequence, at its last position: paged_attention with q_len = 1."""
    num_seqs = q.shape[0]
    query_start_loc = torch.arange(num_seqs + 1, dtype=torch.int32, device=q.device)
    return paged_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x [+ residual]) * weight, x [+ residual]); fp32 math, x's dtype out."""
    h = x.float() if residual is None else x.float() + residual.float()
    normed = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    out = (normed * weight.float()).to(x.dtype)
    return out, (x if residual is None else h.to(x.dtype))


def rotary_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary (rotate_half) on q [T, Hq, D] and k [T, Hkv, D]; returns new tensors."""
    half = cos_sin_cache.shape[1] // 2
    cos_sin = cos_sin_cache[positions.long()].float()  # [T, D]
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]

    def apply(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return rotated.to(x.dtype)

    return apply(q), apply(k)


RmsNorm = Callable[..., tuple[torch.Tensor, torch.Tensor]]
Rotary = Callable[..., tuple[torch.Tensor, torch.Tensor]]
WriteKV = Callable[..., None]
PrepareQKV = Callable[..., torch.Tensor]


def compose_prepare_qkv(rms_norm: RmsNorm, rotary: Rotary, write_kv: WriteKV) -> PrepareQKV:
    """prepare_qkv built from three separate ops (the references here; gpu/torch_ops.py's
    HF-ordered CPU versions there): what the fused Triton kernel computes in one pass."""

    def prepare_qkv(
        qkv: torch.Tensor,
        q_norm_weight: torch.Tensor | None,
        k_norm_weight: torch.Tensor | None,
        eps: float,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        """Split qkv [T, (Hq + 2*Hkv) * D], per-head q/k RMSNorm (when weighted), rotary,
        write_kv. Hkv and D come from the cache shape. Returns q [T, Hq, D], contiguous."""
        num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        num_tokens = qkv.shape[0]
        kv_size = num_kv_heads * head_dim
        q, k, v = torch.split(qkv, [qkv.shape[1] - 2 * kv_size, kv_size, kv_size], dim=-1)
        q = q.reshape(num_tokens, -1, head_dim)
        k = k.reshape(num_tokens, num_kv_heads, head_dim)
        v = v.reshape(num_tokens, num_kv_heads, head_dim)
        if q_norm_weight is not None and k_norm_weight is not None:
            q = rms_norm(q, q_norm_weight, eps)[0]  # over the last dim: per head
            k = rms_norm(k, k_norm_weight, eps)[0]
        q, k = rotary(q, k, positions, cos_sin_cache)
        write_kv(k, v, k_cache, v_cache, slot_mapping)
        return q.contiguous()

    return prepare_qkv


prepare_qkv_ref = compose_prepare_qkv(rms_norm_ref, rotary_ref, write_kv_ref)


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [T, 2I] = [gate | up]; fp32 math, [T, I] in the input dtype."""
    gate, up = gate_up.chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate.float()) * up.float()).to(gate_up.dtype)
