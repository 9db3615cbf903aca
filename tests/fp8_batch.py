"""An fp8 paged batch and the error measure shared by the fp8 KV kernel tests."""

from __future__ import annotations

import torch
from troupe.kernels.kv_quant import quantize
from troupe.kernels.paged_batch import PagedBatch, make_paged_batch


def fp8_batch(
    lens: list[tuple[int, int]], device: str, seed: int, *, cpu_q_heads: int = 6
) -> tuple[PagedBatch, torch.Tensor, torch.Tensor]:
    """A paged batch whose caches are fp8 (NaN where no sequence owns a slot), and its scales."""
    cpu = device == "cpu"
    batch = make_paged_batch(
        lens,
        num_q_heads=cpu_q_heads if cpu else 32,
        num_kv_heads=2 if cpu else 8,
        head_dim=16 if cpu else 128,
        block_size=4 if cpu else 16,
        dtype=torch.float32,
        device=device,
        seed=seed,
    )
    gen = torch.Generator().manual_seed(seed)
    num_kv_heads = batch.k_cache.shape[2]
    k_scale = (0.5 + torch.rand(num_kv_heads, generator=gen)).to(device) / 64
    v_scale = (0.5 + torch.rand(num_kv_heads, generator=gen)).to(device) / 64
    k8 = quantize(batch.k_cache.flatten(0, 1), k_scale).view(batch.k_cache.shape)
    v8 = quantize(batch.v_cache.flatten(0, 1), v_scale).view(batch.v_cache.shape)
    dtype = torch.float32 if cpu else torch.bfloat16
    batch = PagedBatch(
        q=batch.q.to(dtype), k_cache=k8, v_cache=v8, block_tables=batch.block_tables,
        seq_lens=batch.seq_lens, query_start_loc=batch.query_start_loc,
        max_query_len=batch.max_query_len, max_seq_len=batch.max_seq_len,
    )  # fmt: skip
    return batch, k_scale, v_scale


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any(), "NaN: a stray read or an unwritten row"
    return float((out.float() - ref.float()).norm() / ref.float().norm())
