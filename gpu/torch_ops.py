"""The CPU path: plain-torch versions of the model ops over the paged KV layout.

Same signatures as `troupe.kernels.ops`, so the model calls either. Cache layout per layer:
k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]; a token at position p of a
sequence lives in block block_tables[s, p // block_size] at offset p % block_size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from troupe.kernels.reference import compose_prepare_qkv


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store key/value [N, Hkv, D] at flat slots (block * block_size + offset); slots < 0 skip."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, key[keep].to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, value[keep].to(v_cache.dtype))


def _gather(cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    """[len(blocks)...] blocks of one cache -> [length, Hkv, D] in position order."""
    return cache[blocks].reshape(-1, *cache.shape[2:])[:length]


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
) -> torch.Tensor:
    """Causal varlen attention: q [T, Hq, D]; sequence s owns q rows qsl[s]:qsl[s+1], which are
    the last tokens of its seq_lens[s] (already written to the cache)."""
    del max_query_len, max_seq_len
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    rep = q.shape[1] // k_cache.shape[2]
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for s, seq_len in enumerate(lens):
        lo, hi = starts[s], starts[s + 1]
        if hi == lo:
            continue
        blocks = block_tables[s, : math.ceil(seq_len / block_size)].long()
        k = _gather(k_cache, blocks, seq_len).repeat_interleave(rep, dim=1)
        v = _gather(v_cache, blocks, seq_len).repeat_interleave(rep, dim=1)
        num_q = hi - lo
        # query i sits at position seq_len - num_q + i and sees keys 0..that position
        q_pos = torch.arange(seq_len - num_q, seq_len, device=q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
        attn = F.scaled_dot_product_attention(
            q[lo:hi].transpose(0, 1).float(),
            k.transpose(0, 1).float(),
            v.transpose(0, 1).float(),
            attn_mask=mask,
            scale=scale,
        )
        out[lo:hi] = attn.transpose(0, 1).to(q.dtype)
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_seq_len: int,
) -> torch.Tensor:
    """One query per sequence (q [S, Hq, D], the last of seq_lens[s] tokens), batched."""
    num_seqs, num_heads, head_dim = q.shape
    block_size = k_cache.shape[1]
    num_blocks = max(1, math.ceil(max_seq_len / block_size))
    blocks = block_tables[:, :num_blocks].long()
    width = num_blocks * block_size
    k = k_cache[blocks].reshape(num_seqs, width, -1, head_dim)
    v = v_cache[blocks].reshape(num_seqs, width, -1, head_dim)
    rep = num_heads // k.shape[2]
    k = k.repeat_interleave(rep, dim=2).transpose(1, 2).float()
    v = v.repeat_interleave(rep, dim=2).transpose(1, 2).float()
    mask = torch.arange(width, device=q.device)[None, :] < seq_lens[:, None]
    attn = F.scaled_dot_product_attention(
        q[:, :, None, :].float(), k, v, attn_mask=mask[:, None, None, :], scale=scale
    )
    return attn[:, :, 0, :].to(q.dtype)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual) * weight, x + residual); HF order: normalise in fp32, cast, scale."""
    if residual is not None:
        x = x + residual
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype), x


def rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF rotate_half RoPE on q [T, Hq, D] and k [T, Hkv, D]; cache rows [cos | sin]."""
    cos_sin = cos_sin_cache[positions]
    half = cos_sin.shape[-1] // 2
    cos = cos_sin[:, None, :half].repeat(1, 1, 2).to(q.dtype)
    sin = cos_sin[:, None, half:].repeat(1, 1, 2).to(q.dtype)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    return rotate(q), rotate(k)


prepare_qkv = compose_prepare_qkv(rms_norm, rotary, write_kv)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [T, 2I] = [gate | up], in the input dtype like HF's MLP."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
