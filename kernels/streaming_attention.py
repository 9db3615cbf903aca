"""StreamingLLM attention over the paged cache (torch; the CPU path): a streaming sequence's
query at position p sees its first S tokens (the sinks) and its last W tokens (the window,
itself included), with positions as within that cache (Xiao et al. 2023, sec. 3.2):

    cache      [ sink 0 .. S-1 | window p-W+1 .. p ]
    position      0 .. S-1       S .. S+W-1            (once p >= S + W - 1)

RoPE scores depend only on the distance between query and key, so the keys stay stored
rotated at their absolute positions (no pre-rotary copy, nothing rewritten in the cache):

- window key k: cache distance (S + W - 1) - (S + k - (p - W + 1)) = p - k, the true one, so
  the query rotated at its absolute position p (what the model computed) scores it;
- sink key i, stored at its absolute position i, which is its cache position, must meet the
  query at distance c - i, c = min(p, S + W - 1):
  - one query (a decode, `_decode`): the few sink keys are rotated p - c further in the step
    (R(p - c) R(i) k = R(i + p - c) k), then one SDPA over exactly sinks + window rows;
  - a chunk of queries (each its own p - c, `_chunk`): a second copy of the queries rotated at
    their cache positions (`rotate_queries`, from the un-rotated q in qkv, the model's own
    rotary arithmetic) sits beside the first in one [2D] query against keys [k_sink | 0] and
    [0 | k_window], so one SDPA computes q_c . k_sink and q_p . k_window under one softmax;
    tokens outside each query's sinks + window are masked.

Sequences that do not stream in the same step take S = 0, W = everything: plain causal.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from .kv_quant import dequantize
from .reference import _as, _cos_sin, _rotate, rms_norm


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
    q_sink: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    stream: StreamingMetadata,
    scale: float,
    cos_sin_cache: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of q [T, Hq, D] (rotated at absolute positions) over each sequence's sinks +
    window; q rows as in reference.paged_attention. A one-token query rotates its sink keys
    instead (`_decode`); longer chunks need q_sink, the queries at their cache positions."""
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    windows, sinks = stream.windows.tolist(), stream.sink_tokens.tolist()
    for s, seq_len in enumerate(seq_lens.tolist()):
        lo, hi = starts[s], starts[s + 1]
        if hi == lo:
            continue
        window, num_sinks = windows[s] or seq_len, sinks[s] if windows[s] else 0
        num_sinks = min(num_sinks, seq_len)
        caches = (k_cache, v_cache, k_scale, v_scale)
        if hi - lo == 1:
            shift = max(0, seq_len - num_sinks - window)  # p - c: how far the sinks move up
            attn = _decode(q[lo:hi], caches, block_tables[s], seq_len, num_sinks, window, shift,
                           cos_sin_cache, scale)  # fmt: skip
        else:
            assert q_sink is not None, "a streaming chunk needs its cache-position queries"
            attn = _chunk(q[lo:hi], q_sink[lo:hi], caches, block_tables[s], seq_len, num_sinks,
                          window, scale)  # fmt: skip
        out[lo:hi] = _as(attn, q.dtype)
    return out


_Caches = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def _rows(caches: _Caches, table: torch.Tensor, positions: torch.Tensor) -> list[torch.Tensor]:
    """K and V rows [n, Hkv, D] (fp32) of the tokens at `positions`."""
    k_cache, v_cache, k_scale, v_scale = caches
    block_size, heads, dim = k_cache.shape[1:]
    slots = table.long()[positions // block_size] * block_size + positions % block_size
    out = []
    for cache, cache_scale in ((k_cache, k_scale), (v_cache, v_scale)):
        flat = cache.view(-1, heads, dim)
        if cache_scale is not None:  # fp8: index_select moves the bytes, then dequantize
            rows = dequantize(flat.view(torch.uint8).index_select(0, slots).view(cache.dtype),
                              cache_scale)  # fmt: skip
        else:
            rows = flat.index_select(0, slots)
        out.append(_as(rows, torch.float32))
    return out


def _decode(
    q: torch.Tensor,
    caches: _Caches,
    table: torch.Tensor,
    seq_len: int,
    num_sinks: int,
    window: int,
    shift: int,
    cos_sin_cache: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query at p = seq_len - 1: exactly the sink and window rows, the sink keys rotated
    `shift` = p - c further (R(shift) R(i) k = R(i + shift) k: sink i then sits at distance
    c - i from the query at p), one SDPA without a mask. Measured cheaper on the CPU than the
    two-query form for one query (ops/streaming_attention_bench.py)."""
    first = max(num_sinks, seq_len - window)
    positions = torch.cat((torch.arange(num_sinks), torch.arange(first, seq_len)))
    keys, values = _rows(caches, table, positions)
    if shift and num_sinks:
        cos, sin = _cos_sin(torch.tensor([shift]), cos_sin_cache, torch.float32)
        keys[:num_sinks] = _rotate(keys[:num_sinks], cos, sin)
    attn = F.scaled_dot_product_attention(
        _as(q, torch.float32)[:, :, None],
        keys.transpose(0, 1)[None],
        values.transpose(0, 1)[None],
        scale=scale,
        enable_gqa=True,
    )
    return attn[:, :, 0]


def _chunk(
    q: torch.Tensor,
    q_sink: torch.Tensor,
    caches: _Caches,
    table: torch.Tensor,
    seq_len: int,
    num_sinks: int,
    window: int,
    scale: float,
) -> torch.Tensor:
    """Queries at seq_len - len(q) .. seq_len - 1, each its own shift: the two-query form (q_sink
    scores the sinks, q the window) in one 2D-wide SDPA under a mask."""
    first_q = seq_len - q.shape[0]
    first = max(num_sinks, first_q - window + 1)  # the first query's window
    positions = torch.cat((torch.arange(num_sinks), torch.arange(first, seq_len)))
    keys, values = _rows(caches, table, positions)
    q_pos = torch.arange(first_q, seq_len)[:, None]
    k_pos = positions[None, :]
    is_sink = k_pos < num_sinks
    visible = (k_pos <= q_pos) & (is_sink | (k_pos > q_pos - window))
    zeros = torch.zeros_like(keys)
    # [n, Hkv, 2D]: sinks meet the cache-position query, window keys the absolute one
    keys = torch.where(is_sink[0, :, None, None], torch.cat((keys, zeros), -1),
                       torch.cat((zeros, keys), -1))  # fmt: skip
    # as wide as the keys: SDPA's CPU kernels take a ~5x slower path when they differ
    values = torch.cat((values, torch.zeros_like(values)), dim=-1)
    query = torch.cat((_as(q_sink, torch.float32), _as(q, torch.float32)), dim=-1)
    attn = F.scaled_dot_product_attention(
        query.transpose(0, 1)[None],
        keys.transpose(0, 1)[None],
        values.transpose(0, 1)[None],
        attn_mask=visible,
        scale=scale,
        enable_gqa=True,
    )
    return attn[0].transpose(0, 1)[..., : q.shape[-1]]
