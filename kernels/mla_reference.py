"""Multi-head latent attention (DeepSeek-V2/V3) over a paged latent cache, in torch.

One cache per layer holds, per token, the normalised latent c (kv_lora_rank values) and the
rotated rope key k_r (qk_rope_head_dim values), shared by all heads:

    latent_cache [num_blocks, block_size, L + R]     slot = block * block_size + offset

kv_b_proj [H * (Dn + Dv), L] expands c into per-head keys and values: head h's rows are
[W_uk (Dn rows) | W_uv (Dv rows)]. A query is q_nope [H, Dn] and rotated q_rope [H, R].

    expanded (prefill):  k_h = [W_uk,h c | k_r], v_h = W_uv,h c; causal attention per head
    absorbed (decode):   q_lat,h = W_uk,h^T q_nope,h (L wide); score = q_lat . c + q_rope . k_r;
                         out_h = W_uv,h (softmax(score) @ c): the cache is read once, latent only

Both compute the same function (the tests check them against each other and transformers'
DeepseekV3Attention). Softmax in fp32. `mla_attention` is the CPU model's op: expanded for
prefill rows (transformers' arithmetic), absorbed for decode steps; `mla_prefill` is the
expanded op by name (the model calls it for the prefill sequences of a step it splits,
kernels/mla_prefill.py being its Triton side).
"""

from __future__ import annotations

import torch


def write_latent(
    latent: torch.Tensor, k_rope: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """In place: [c | k_r] of latent [N, L] and k_rope [N, R] at slot_mapping [N] (< 0 skips)."""
    keep = slot_mapping >= 0
    rows = torch.cat([latent, k_rope], dim=-1)[keep].to(cache.dtype)
    cache.view(-1, cache.shape[-1]).index_copy_(0, slot_mapping[keep].long(), rows)


def _tokens(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` cached tokens of one sequence, [length, L + R], in position order."""
    block_size = cache.shape[1]
    blocks = block_table[: -(-length // block_size)].long()
    return cache.index_select(0, blocks).reshape(-1, cache.shape[-1])[:length]


def mla_prefill_expanded(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    kv_b_proj: torch.Tensor,
    v_head_dim: int,
    scale: float,
) -> torch.Tensor:
    """Causal attention [T, H, Dv] for the new tokens of each sequence (their latents already
    in the cache); query i of sequence s sits at position seq_lens[s] - q_len_s + i."""
    num_heads, dn = q_nope.shape[1], q_nope.shape[2]
    rope = q_rope.shape[2]
    out = q_nope.new_zeros(q_nope.shape[0], num_heads, v_head_dim)
    starts = query_start_loc.tolist()
    for s, length in enumerate(seq_lens.tolist()):
        lo, hi = starts[s], starts[s + 1]
        if hi == lo:
            continue
        tokens = _tokens(cache, block_tables[s], length).to(q_nope.dtype)
        latent, k_r = tokens[:, :-rope], tokens[:, -rope:]
        kv = (latent @ kv_b_proj.T).view(length, num_heads, dn + v_head_dim)
        k = torch.cat([kv[..., :dn], k_r[:, None].expand(length, num_heads, rope)], dim=-1)
        q = torch.cat([q_nope[lo:hi], q_rope[lo:hi]], dim=-1)
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
        pos = torch.arange(length - (hi - lo), length, device=q.device)
        causal = torch.arange(length, device=q.device)[None, :] > pos[:, None]
        probs = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        attn = torch.einsum("hqk,khd->qhd", probs, kv[..., dn:].float())
        out[lo:hi] = attn.to(out.dtype)
    return out


def mla_decode_absorbed(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_b_proj: torch.Tensor,
    v_head_dim: int,
    scale: float,
) -> torch.Tensor:
    """Decode [S, H, Dv]: one query per sequence at position seq_lens[s] - 1, in latent space."""
    num_seqs, num_heads, dn = q_nope.shape
    rope = q_rope.shape[2]
    w = kv_b_proj.view(num_heads, dn + v_head_dim, -1).float()
    w_uk, w_uv = w[:, :dn], w[:, dn:]  # [H, Dn, L], [H, Dv, L]
    q_lat = torch.einsum("shd,hdl->shl", q_nope.float(), w_uk)
    out = q_nope.new_zeros(num_seqs, num_heads, v_head_dim)
    for s, length in enumerate(seq_lens.tolist()):
        tokens = _tokens(cache, block_tables[s], length).float()
        latent, k_r = tokens[:, :-rope], tokens[:, -rope:]
        scores = (q_lat[s] @ latent.T + q_rope[s].float() @ k_r.T) * scale  # [H, n]
        o_lat = scores.softmax(dim=-1) @ latent  # [H, L]
        out[s] = torch.einsum("hl,hvl->hv", o_lat, w_uv).to(out.dtype)
    return out


def mla_attention(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    kv_b_proj: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    v_head_dim: int,
    scale: float,
    is_decode: bool,
) -> torch.Tensor:
    """The KernelOps op (kernels/ops.py): absorbed for a decode step, expanded otherwise."""
    if is_decode:
        num_rows = q_nope.shape[0]
        return mla_decode_absorbed(
            q_nope, q_rope, cache, block_tables, seq_lens[:num_rows], kv_b_proj, v_head_dim, scale
        )
    return mla_prefill_expanded(
        q_nope, q_rope, cache, block_tables, seq_lens, query_start_loc, kv_b_proj, v_head_dim, scale
    )


def mla_prefill(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    kv_b_proj: torch.Tensor,
    blocks: torch.Tensor,
    tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    v_head_dim: int,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
) -> torch.Tensor:
    """The KernelOps op (kernels/ops.py): the expanded form for every sequence."""
    del max_query_len, max_seq_len  # launch hints of the Triton side
    block_tables = blocks[tables.long()]
    return mla_prefill_expanded(
        q_nope, q_rope, cache, block_tables, seq_lens, query_start_loc, kv_b_proj, v_head_dim, scale
    )
