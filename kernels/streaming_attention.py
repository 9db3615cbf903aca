"""StreamingLLM attention over the paged cache (torch; the CPU path): a streaming sequence's
query at position p sees its first S tokens (the sinks) and its last W tokens (the window,
itself included), with positions as within that cache (Xiao et al. 2023, sec. 3.2):

    cache      [ sink 0 .. S-1 | window p-W+1 .. p ]
    position      0 .. S-1       S .. S+W-1            (once p >= S + W - 1)

RoPE scores depend only on the distance between query and key, so the keys stay stored
rotated at their absolute positions (no re-rotation, no pre-rotary copy) and only the query
changes:

- window key k: cache distance (S + W - 1) - (S + k - (p - W + 1)) = p - k, the true one, so
  the query rotated at its absolute position p (what the model computed) scores it;
- sink key i, stored at its absolute position i, which is its cache position: the query
  rotated at its cache position c = min(p, S + W - 1) scores it (`rotate_queries`, from the
  un-rotated q in qkv, the same arithmetic as the model's rotary).

One softmax over both sets: the two query copies sit side by side in one [2D] query against
keys [k_sink | 0] and [0 | k_window], so SDPA computes q_c . k_sink and q_p . k_window in one
pass (grouped-query heads without copies). Tokens held in memory but outside sinks + window
(the sink block's tail, a partly passed block's head) are masked.

Sequences that do not stream in the same step take S = 0, W = everything: plain causal.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from .kv_quant import dequantize
from .reference import _as, _cos_sin, _gather, _rotate, rms_norm


@dataclasses.dataclass(frozen=True)
class StreamingMetadata:
    """Per sequence of a step: its window (0: not streaming) and sink tokens; per token: the
    position its query takes against the sinks (its own position when not streaming)."""

    windows: torch.Tensor  # [S] int32
    sink_tokens: torch.Tensor  # [S] int32
    cache_positions: torch.Tensor  # [T] int64


def rotate_queries(
    qkv: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    num_q_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """The queries of qkv [T, ...] (per-head normed when weighted) rotated at `positions`:
    [T, Hq, D], as prepare_qkv rotates them at the absolute ones."""
    q = qkv[:, : num_q_heads * head_dim].reshape(qkv.shape[0], num_q_heads, head_dim)
    if q_norm_weight is not None:
        q = rms_norm(q, q_norm_weight, eps)[0]
    return _rotate(q, *_cos_sin(positions, cos_sin_cache, qkv.dtype))


def streaming_attention(
    q: torch.Tensor,
    q_sink: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    stream: StreamingMetadata,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of q [T, Hq, D] (rotated at absolute positions) and q_sink (at cache
    positions) over each sequence's sinks + window; q rows as in reference.paged_attention."""
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    windows, sinks = stream.windows.tolist(), stream.sink_tokens.tolist()
    block_size = k_cache.shape[1]
    f32 = torch.float32
    for s, seq_len in enumerate(seq_lens.tolist()):
        lo, hi = starts[s], starts[s + 1]
        if hi == lo:
            continue
        first_q = seq_len - (hi - lo)
        window, num_sinks = windows[s] or seq_len, sinks[s] if windows[s] else 0
        num_sinks = min(num_sinks, seq_len)
        # window keys from the first query's window (never a released block), sinks apart
        first_block = max(num_sinks, first_q - window + 1) // block_size
        table = block_tables[s]
        parts = [_gather(c, table, first_block, seq_len) for c in (k_cache, v_cache)]
        sink_parts = [_gather(c, table, 0, num_sinks) for c in (k_cache, v_cache)]
        k_win, v_win = parts
        k_sink, v_sink = sink_parts
        if k_scale is not None and v_scale is not None:  # fp8 cache
            k_win, v_win = dequantize(k_win, k_scale), dequantize(v_win, v_scale)
            k_sink, v_sink = dequantize(k_sink, k_scale), dequantize(v_sink, v_scale)
        q_pos = torch.arange(first_q, seq_len, device=q.device)[:, None]
        win_pos = torch.arange(first_block * block_size, seq_len, device=q.device)[None, :]
        sink_pos = torch.arange(num_sinks, device=q.device)[None, :]
        visible = torch.cat(
            (
                sink_pos <= q_pos,
                (win_pos >= num_sinks) & (win_pos <= q_pos) & (win_pos > q_pos - window),
            ),
            dim=1,
        )
        k_sink, k_win = _as(k_sink, f32), _as(k_win, f32)
        keys = torch.cat(  # [n, Hkv, 2D]: sinks score the cache-position query, the rest not
            (
                torch.cat((k_sink, torch.zeros_like(k_sink)), dim=-1),
                torch.cat((torch.zeros_like(k_win), k_win), dim=-1),
            )
        )
        values = torch.cat((_as(v_sink, f32), _as(v_win, f32)))
        # as wide as the keys: SDPA's CPU kernels take a ~5x slower path when they differ
        values = torch.cat((values, torch.zeros_like(values)), dim=-1)
        query = torch.cat((_as(q_sink[lo:hi], f32), _as(q[lo:hi], f32)), dim=-1)
        attn = F.scaled_dot_product_attention(
            query[None].transpose(1, 2),
            keys[None].transpose(1, 2),
            values[None].transpose(1, 2),
            attn_mask=visible,
            scale=scale,
            enable_gqa=True,
        )
        out[lo:hi] = _as(attn[0].transpose(0, 1)[..., : q.shape[-1]], q.dtype)
    return out
