"""MLA prefill in the expanded form: the latent cache decompressed to per-head K/V, then the
paged varlen prefill kernel (kernels/paged_attention.py), on the Triton side.

The absorbed form (kernels/mla_ops.py) is the decode form: one query row reads the latent
once for all heads, memory-bound. A prefill chunk of q tokens over n keys costs it
2 * H * q * n * (2L + R) FLOPs (L + R for the score, L for the output); expanded, the same
attention costs 2 * H * q * n * (Dn + R + Dv) plus the expansion, 2 * n * L * H * (Dn + Dv)
once per key. For DeepSeek-V2-Lite (L 512, R 64, Dn = Dv = 128) that is 1,088 against 320
per (query, key, head), so past ~85 query tokens per sequence expanding wins, and the
expanded attention runs on the tensor-core tile kernel as any GQA prefill does (DeepSeek's
and vLLM's split of the two forms).

    blocks    exactly the prefill sequences' cache blocks, in order (built on the host once per
              step, gpu/device_inputs.expanded_prefill), and tables into them
    expand    kv = c @ kv_b_proj^T per cached token -> k = [k_nope | k_r], v = [v | 0]
    attend    paged_attention_triton over the expanded blocks with those tables

V is zero-padded to the q/k head dim (Dn + R) so one HEAD_DIM serves the tile kernel; the
padded output columns are dropped. The expanded blocks live for the call only. Shapes depend
on the number of blocks (host knowledge): this path runs eagerly, never inside a CUDA graph
(gpu/forward_pass.py).
"""

from __future__ import annotations

import torch

from .paged_attention import paged_attention_triton


def expand_latent_blocks(
    cache: torch.Tensor,
    blocks: torch.Tensor,
    kv_b_proj: torch.Tensor,
    num_heads: int,
    v_head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, v): [NB, block_size, H, Dn + R] each, the cache blocks `blocks` [NB] expanded with
    kv_b_proj [H * (Dn + Dv), L] (v zero past Dv)."""
    _, block_size, row = cache.shape
    latent_size = kv_b_proj.shape[1]
    rope = row - latent_size
    dn = kv_b_proj.shape[0] // num_heads - v_head_dim
    rows = cache.index_select(0, blocks).to(kv_b_proj.dtype)  # [NB, bs, L + R]
    kv = (rows[..., :latent_size] @ kv_b_proj.T).view(-1, block_size, num_heads, dn + v_head_dim)
    k = torch.empty(*kv.shape[:3], dn + rope, dtype=kv.dtype, device=kv.device)
    k[..., :dn] = kv[..., :dn]
    k[..., dn:] = rows[..., None, latent_size:]
    v = torch.zeros_like(k)
    v[..., :v_head_dim] = kv[..., dn:]
    return k, v


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
    """Causal attention [T, H, Dv] of the new tokens of each sequence (latents already in the
    cache [blocks, block_size, L + R]) in the expanded form; sequence s's j-th block is
    blocks[tables[s, j]]; rows as in paged_attention."""
    num_heads = q_nope.shape[1]
    k, v = expand_latent_blocks(cache, blocks, kv_b_proj, num_heads, v_head_dim)
    q = torch.cat([q_nope, q_rope.to(q_nope.dtype)], dim=-1)
    out = paged_attention_triton(
        q, k, v, tables, seq_lens, query_start_loc, scale, max_query_len, max_seq_len
    )
    return out[..., :v_head_dim]
