"""The torch implementation of every model op: the CPU path, and the reference of the kernels.

One implementation serves both, so the kernel tests check the Triton kernels against exactly
what the CPU runs. Two choices make it fit both roles:

- HF transformers' rounding order (normalise in fp32, cast, then scale; rotary and SwiGLU in
  the input dtype; residual adds in the input dtype), so a CPU model is token-identical to
  transformers. In fp32, which the kernel tests compare in, the order changes nothing.
- Fast torch ops, not loops of small ones: scaled_dot_product_attention (grouped-query heads
  without copies), index_select / index_copy_, one batched gather for all decodes. Attention
  softmax is fp32 whatever the input dtype.

It is also robust to what the kernel tests feed it: block-table padding may hold any block id
and cache slots past a sequence's end may hold NaN; neither reaches an output.

Cache layout per layer: k_cache, v_cache [num_blocks, block_size, Hkv, D]; the token at
position p of sequence s is in block block_tables[s, p // block_size] at offset p % block_size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .kv_quant import dequantize, quantize
from .kv_quant import update_kv_scales as update_kv_scales  # KernelOps: the torch form
from .mla_reference import mla_attention as mla_attention  # MLA has its own module
from .mla_reference import mla_prefill as mla_prefill
from .mla_reference import write_latent as write_latent
from .moe_reference import fused_moe as fused_moe  # the MoE op has its own module


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Store key/value [N, Hkv, D] at flat slots (block * block_size + offset); slots < 0 skip.
    fp8 caches store x / scale (per head, kernels.kv_quant)."""
    slots = _as(slot_mapping, torch.int64)
    if (
        slots.numel() and int(slots.min()) < 0
    ):  # padding rows: drop them (a decode step on the CPU has none)
        keep = slots >= 0
        slots, key, value = slots[keep], key[keep], value[keep]
    if k_scale is not None and v_scale is not None:
        # fp8 has no index_copy_: scatter its bytes
        k_bytes = quantize(key, k_scale).view(torch.uint8)
        v_bytes = quantize(value, v_scale).view(torch.uint8)
        k_cache.view(torch.uint8).view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k_bytes)
        v_cache.view(torch.uint8).view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v_bytes)
        return
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, _as(key, k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, _as(value, v_cache.dtype))


reads_new_kv = False  # KernelOps: paged_attention reads the cache alone
_UNKNOWN = -1  # _gather's run when the caller has not looked (real runs start at >= 0)


def _gather(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    first_block: int,
    length: int,
    run: int | None = _UNKNOWN,
) -> torch.Tensor:
    """Tokens first_block * block_size .. length - 1 of one sequence's cache, [n, Hkv, D], in
    position order; blocks before first_block are never read (a window may have freed them)."""
    block_size = cache.shape[1]
    blocks = block_table[first_block : math.ceil(length / block_size)]
    run = _contiguous_run(blocks) if run == _UNKNOWN else run
    if run is not None:  # consecutive block ids (the usual case): a view, no copy
        rows = cache[run : run + blocks.shape[0]]
        return rows.reshape(-1, *cache.shape[2:])[: length - first_block * block_size]
    blocks = blocks.long()
    if cache.dtype == torch.float8_e4m3fn:  # index_select has no fp8 kernel: move bytes
        rows = cache.view(torch.uint8).index_select(0, blocks).view(cache.dtype)
    else:
        rows = cache.index_select(0, blocks)
    return rows.reshape(-1, *cache.shape[2:])[: length - first_block * block_size]


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in `dtype`; x itself when it already is (no aten::to call: the CPU decode path makes
    ~30 such calls per layer, each a dispatch even when it changes nothing)."""
    return x if x.dtype == dtype else x.to(dtype)


def _contiguous_run(blocks: torch.Tensor) -> int | None:
    """The first id when the block ids are consecutive (b, b + 1, ...), else None. A one-
    sequence table usually is (the allocator hands out a fresh pool in order), and its
    gather is then a view: ~2x faster decode attention on the CPU at 100 tokens, ~2.5x at
    1,000."""
    if blocks.device.type != "cpu" or blocks.numel() == 0:
        return None
    ids = blocks.tolist()
    first: int = ids[0]
    return (
        first
        if ids[-1] - first == len(ids) - 1 and ids == list(range(first, first + len(ids)))
        else None
    )


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
    decode_prefix: torch.Tensor | None = None,
    *,
    sliding_window: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    seq_order: torch.Tensor | None = None,
    new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    key_limits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal varlen attention: q [T, Hq, D]; sequence s owns q rows qsl[s]:qsl[s+1], which are
    the last tokens of its seq_lens[s] (already written to the cache); `key_limits` lift a
    row's causal edge. See kernels.ops."""
    # launch hints for the kernels (new_kv: the cache holds the same values)
    del max_query_len, max_seq_len, decode_prefix, seq_order, new_kv
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    block_size = k_cache.shape[1]
    for s, seq_len in enumerate(seq_lens.tolist()):
        lo, hi = starts[s], starts[s + 1]
        if hi == lo:
            continue
        first_q = seq_len - (hi - lo)
        # the first block any query of this sequence still sees
        first_block = max(0, first_q - sliding_window + 1) // block_size if sliding_window else 0
        k = _gather(k_cache, block_tables[s], first_block, seq_len)
        v = _gather(v_cache, block_tables[s], first_block, seq_len)
        if k_scale is not None and v_scale is not None:  # fp8 cache
            k, v = dequantize(k, k_scale), dequantize(v, v_scale)
        # query i sits at position seq_len - num_q + i and sees keys 0..that position (the last
        # sliding_window of them when windowed); a whole prompt without a window is plain
        # causal (no mask tensor). 4-D with a batch dim: the CPU's fused kernel (3-D inputs
        # take a ~4x slower path at 1,000 tokens)
        mask = None
        if first_q or sliding_window or key_limits is not None:
            q_pos = torch.arange(first_q, seq_len, device=q.device)
            k_pos = torch.arange(first_block * block_size, seq_len, device=q.device)
            edge = q_pos if key_limits is None else key_limits[lo:hi].to(q_pos.dtype)
            mask = k_pos[None, :] <= edge[:, None]
            if sliding_window:
                mask &= k_pos[None, :] > q_pos[:, None] - sliding_window
        attn = _sdpa(
            _as(q[None, lo:hi].transpose(1, 2), torch.float32),
            _as(k[None].transpose(1, 2), torch.float32),
            _as(v[None].transpose(1, 2), torch.float32),
            mask=mask,
            is_causal=mask is None and hi - lo > 1,
            scale=scale,
            softcap=softcap,
            sinks=sinks,
        )
        out[lo:hi] = _as(attn[0].transpose(0, 1), q.dtype)
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_seq_len: int,
    *,
    sliding_window: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    seq_order: torch.Tensor | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per sequence (q [S, Hq, D], the last of its seq_lens[s] tokens), batched: every
    sequence's context is gathered into one [S, W] window, W = max_seq_len in whole blocks (or
    sliding_window tokens, when smaller: then window position p holds token base + p, with
    base = seq_len - sliding_window clamped at 0).

    Window position p of sequence s holds its token base + p when that is < seq_lens[s], else
    its token base: that slot is written, so finite (past the end, a slot or a padding table
    entry may hold anything, and 0 * NaN would reach the output), and the mask hides it.
    """
    del seq_order  # a launch-order hint: one batched computation has none
    num_seqs, _, head_dim = q.shape
    if num_seqs == 1 and not sliding_window and k_scale is None:  # one stream: no mask
        return _single_decode(
            q, k_cache, v_cache, block_tables[0], int(seq_lens[0]), scale, softcap, sinks
        )
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_blocks = min(max(1, math.ceil(max_seq_len / block_size)), block_tables.shape[1])
    width = num_blocks * block_size
    lens = seq_lens.long()[:, None]
    base = torch.zeros_like(lens)
    if sliding_window and sliding_window < width:
        width = sliding_window
        base = (lens - sliding_window).clamp(min=0)
    pos = base + torch.arange(width, device=q.device)[None, :]
    visible = pos < lens  # [S, W]
    pos = torch.where(visible, pos, base)
    blocks = block_tables[:, :num_blocks].long().gather(1, pos // block_size)
    slots = (blocks * block_size + pos % block_size).view(-1)

    def window(cache: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        """[S, Hkv, W, D] fp32: one index_select of token rows (dequantized when fp8)."""
        flat = cache.reshape(-1, num_kv_heads, head_dim)
        if scale is not None:  # fp8: index_select moves the bytes
            rows = dequantize(
                flat.view(torch.uint8).index_select(0, slots).view(cache.dtype), scale
            )
        else:
            rows = flat.index_select(0, slots)
        return rows.view(num_seqs, width, num_kv_heads, head_dim).float().transpose(1, 2)

    attn = _sdpa(
        q[:, :, None, :].float(),
        window(k_cache, k_scale),
        window(v_cache, v_scale),
        mask=visible[:, None, None, :],
        is_causal=False,
        scale=scale,
        softcap=softcap,
        sinks=sinks,
    )
    return attn[:, :, 0, :].to(q.dtype)


def _single_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
    softcap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """One sequence's decode: its seq_len keys gathered in order, SDPA without a mask."""
    blocks = block_table[: math.ceil(seq_len / k_cache.shape[1])]
    run = _contiguous_run(blocks)  # once for both caches
    k = _gather(k_cache, blocks, 0, seq_len, run)[None].transpose(1, 2)  # [1, Hkv, n, D]
    v = _gather(v_cache, blocks, 0, seq_len, run)[None].transpose(1, 2)
    f32 = torch.float32
    attn = _sdpa(
        _as(q[:, :, None, :], f32), _as(k, f32), _as(v, f32), mask=None, is_causal=False,
        scale=scale, softcap=softcap, sinks=sinks,
    )  # fmt: skip
    return _as(attn[:, :, 0, :], q.dtype)


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
    softcap: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of [B, Hq, Lq, D] queries over [B, Hkv, Lk, D] keys and values (mask: True
    where visible; is_causal: Lq == Lk, plain causal): SDPA (grouped-query heads without
    copies), or written out as transformers' eager attention writes it (SDPA has neither):
    with softcap > 0 the scores capped (score * scale / softcap, tanh, * softcap) before the
    mask; with sinks [Hq] each head's sink a last column of the scores, dropped after the
    softmax (kernels/sinks.py)."""
    if not softcap and sinks is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=True
        )
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if is_causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        return torch.softmax(scores, dim=-1) @ v
    column = sinks.to(scores.dtype)[None, :, None, None].expand(*scores.shape[:3], 1)
    probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)
    return probs[..., :-1] @ v


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual) * weight, x + residual); HF order: normalise in fp32, cast, scale."""
    if residual is not None:
        x = x + residual
    xf = _as(x, torch.float32)
    normed = xf * xf.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
    return weight * _as(normed, x.dtype), x


def rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF rotate_half RoPE on q [T, Hq, D] and k [T, Hkv, D]; cache rows [cos | sin].

    Returns new tensors (the Triton kernel rotates in place: callers use the return value)."""
    cos, sin = _cos_sin(positions, cos_sin_cache, q.dtype)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _cos_sin(
    positions: torch.Tensor, cos_sin_cache: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 1, D / 2] in `dtype` (rounded from the fp32 table, as HF does)."""
    cos, sin = _as(cos_sin_cache.index_select(0, positions), dtype)[:, None].chunk(2, dim=-1)
    return cos, sin


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * [cos | cos] + rotate_half(x) * [sin | sin], half by half: the same roundings as HF
    (x1 cos + (-x2) sin == x1 cos - x2 sin exactly), without building the repeated tables."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


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
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    keep_k: bool = False,
) -> torch.Tensor:
    """Split qkv [T, (Hq + 2*Hkv) * D], per-head q/k RMSNorm (when weighted), rotary, write_kv:
    what the fused kernel does in one pass. Hkv and D come from the cache shape. Returns q
    [T, Hq, D], contiguous; keep_k also writes the rotated k over qkv's k columns (fp8: the
    cache's units over k's and v's)."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    num_tokens = qkv.shape[0]
    kv_size = num_kv_heads * head_dim
    q_size = qkv.shape[1] - 2 * kv_size
    v = qkv[:, q_size + kv_size :].reshape(num_tokens, num_kv_heads, head_dim)
    if q_norm_weight is not None and k_norm_weight is not None:
        q, k = qkv[:, :q_size], qkv[:, q_size : q_size + kv_size]
        q = rms_norm(q.reshape(num_tokens, -1, head_dim), q_norm_weight, eps)[0]  # per head
        k = rms_norm(k.reshape(num_tokens, num_kv_heads, head_dim), k_norm_weight, eps)[0]
        q, k = rotary(q, k, positions, cos_sin_cache)
    else:  # q and k sit side by side in qkv: rotate them as one [T, Hq + Hkv, D] tensor
        qk = qkv[:, : q_size + kv_size].reshape(num_tokens, -1, head_dim)
        qk = _rotate(qk, *_cos_sin(positions, cos_sin_cache, qkv.dtype))
        num_q_heads = qk.shape[1] - num_kv_heads
        q, k = qk[:, :num_q_heads], qk[:, num_q_heads:]
    write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)
    if keep_k and k_scale is not None and v_scale is not None:  # the fp8 cache's units
        units = torch.cat([quantize(k, k_scale), quantize(v, v_scale)], 1).to(qkv.dtype)
        qkv[:, q_size:] = units.flatten(1)
    elif keep_k:
        qkv[:, q_size : q_size + kv_size] = k.reshape(num_tokens, kv_size)
    return q.contiguous()


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [T, 2I] = [gate | up], in the input dtype like HF's MLP."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up (GeGLU) for gate_up [T, 2I], in the input dtype like HF's Gemma MLP."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
