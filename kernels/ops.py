"""The kernels the model runner calls: Triton on CUDA tensors, torch references elsewhere.

TROUPE_FORCE_TRITON=1 takes the Triton path for CPU tensors too (under TRITON_INTERPRET=1), so
the CPU tests exercise the kernels themselves. KV cache layout, shared with troupe.gpu:

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    slot = block_id * block_size + offset_in_block          (int64; < 0 means "skip")
    block_tables: [num_seqs, max_blocks_per_seq] int32      (padding entries never read)
"""

from __future__ import annotations

import os

import torch

# Relative imports: they resolve as troupe.kernels.* at run time and for mypy alike.
from . import reference
from .rope_cache import build_cos_sin_cache

__all__ = [
    "build_cos_sin_cache",
    "paged_attention",
    "paged_decode_attention",
    "prepare_qkv",
    "rms_norm",
    "rotary",
    "silu_mul",
    "use_triton",
    "write_kv",
]


def use_triton(t: torch.Tensor) -> bool:
    """True when calls on this tensor go to Triton (CUDA, or TROUPE_FORCE_TRITON=1)."""
    return t.is_cuda or os.environ.get("TROUPE_FORCE_TRITON", "0") == "1"


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """In place: key/value [N, Hkv, D] into the caches at slot_mapping [N] int64 (< 0 skips)."""
    if use_triton(key):
        from .kv_write import write_kv_triton

        write_kv_triton(key, value, k_cache, v_cache, slot_mapping)
    else:
        reference.write_kv_ref(key, value, k_cache, v_cache, slot_mapping)


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
    """Varlen causal attention for prefill, chunked prefill and decode rows in one call.

    q [T, Hq, D] concatenates each sequence's new tokens (query_start_loc [S+1] int32,
    cumulative). seq_lens [S] int32 counts each sequence's tokens INCLUDING the new ones, whose
    KV is already in the cache. Query i of sequence s sits at position seq_lens[s] - q_len_s + i
    and sees keys at positions <= its own. Hq must be a multiple of Hkv. Returns [T, Hq, D] in
    q's dtype; softmax in fp32.
    """
    if use_triton(q):
        from .paged_attention import paged_attention_triton

        return paged_attention_triton(
            q,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            query_start_loc,
            scale,
            max_query_len,
            max_seq_len,
        )
    return reference.paged_attention_ref(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_seq_len: int,
) -> torch.Tensor:
    """Decode: q [S, Hq, D] holds one query per sequence, at position seq_lens[s] - 1.

    max_seq_len (a host int, an upper bound of seq_lens) picks the number of context splits, so
    a CUDA graph captured with a fixed max_seq_len replays one fixed launch.
    """
    if use_triton(q):
        from .decode_attention import paged_decode_attention_triton

        return paged_decode_attention_triton(
            q, k_cache, v_cache, block_tables, seq_lens, scale, max_seq_len
        )
    return reference.paged_decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, scale)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim, fp32 math, x's dtype out.

    Without residual: (rmsnorm(x) * weight, x). With it: h = x + residual, returns
    (rmsnorm(h) * weight, h): the fused add + norm of a pre-norm transformer block.
    """
    if use_triton(x):
        from .rms_norm import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual)
    return reference.rms_norm_ref(x, weight, eps, residual)


def rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary on q [T, Hq, D] and k [T, Hkv, D] at positions [T] int64.

    Use the returned tensors: the Triton path rotates q and k in place and returns them, the
    reference returns new tensors.
    """
    if use_triton(q):
        from .rotary import rotary_triton

        return rotary_triton(q, k, positions, cos_sin_cache)
    return reference.rotary_ref(q, k, positions, cos_sin_cache)


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
    """The attention prologue on the fused projection output qkv [T, (Hq + 2*Hkv) * D].

    Per head RMSNorm of q and k over D (Qwen3; only when both weights are given), neox rotary
    at positions [T], k and v written to the caches at slot_mapping [T] (< 0 skips). Hkv and D
    come from the cache shape. Returns q [T, Hq, D], new and contiguous, in qkv's dtype.
    """
    if use_triton(qkv):
        from .qkv_prepare import prepare_qkv_triton

        return prepare_qkv_triton(
            qkv,
            q_norm_weight,
            k_norm_weight,
            eps,
            positions,
            cos_sin_cache,
            k_cache,
            v_cache,
            slot_mapping,
        )
    return reference.prepare_qkv_ref(
        qkv,
        q_norm_weight,
        k_norm_weight,
        eps,
        positions,
        cos_sin_cache,
        k_cache,
        v_cache,
        slot_mapping,
    )


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(gate) * up for gate_up [T, 2I] = [gate | up]; returns [T, I], fp32 math."""
    if use_triton(gate_up):
        from .silu_mul import silu_mul_triton

        return silu_mul_triton(gate_up)
    return reference.silu_mul_ref(gate_up)
