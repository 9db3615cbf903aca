"""Random paged-KV batches for the kernel tests and the kernel benchmark.

Blocks are handed out in a random order (so contiguity is never assumed), block-table padding
holds a huge block id (reading it faults or poisons the result), and with poison=True every
cache slot that no sequence owns is NaN, so a kernel that reads past a sequence's end fails.
"""

from __future__ import annotations

import dataclasses

import torch

PADDING_BLOCK_ID = 2**30


@dataclasses.dataclass(frozen=True)
class PagedBatch:
    """Inputs of paged_attention for one batch; KV of every token, new ones too, is cached."""

    q: torch.Tensor  # [T, Hq, D]: the new tokens of all sequences, concatenated
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [S, max_blocks] int32
    seq_lens: torch.Tensor  # [S] int32, cached prefix + new tokens
    query_start_loc: torch.Tensor  # [S + 1] int32
    max_query_len: int
    max_seq_len: int


def make_paged_batch(
    lens: list[tuple[int, int]],
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int,
    poison: bool = True,
) -> PagedBatch:
    """A batch of sequences given as (cached prefix length, new token count) pairs."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [ctx + new for ctx, new in lens]
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # a few blocks nobody owns
    order = torch.randperm(num_blocks, generator=gen)
    max_blocks = max(blocks_per_seq) + 2  # padding columns past every sequence's end
    block_tables = torch.full((len(lens), max_blocks), PADDING_BLOCK_ID, dtype=torch.int32)
    slots: list[torch.Tensor] = []
    next_block = 0
    for s, (n, nb) in enumerate(zip(seq_lens, blocks_per_seq, strict=True)):
        ids = order[next_block : next_block + nb]
        next_block += nb
        block_tables[s, :nb] = ids.to(torch.int32)
        pos = torch.arange(n)
        slots.append(ids[pos // block_size] * block_size + pos % block_size)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = []
    for _ in range(2):
        if poison:
            cache = torch.full(shape, float("nan"), dtype=torch.float32)
            flat = cache.view(-1, num_kv_heads, head_dim)
            all_slots = torch.cat(slots)
            flat[all_slots] = torch.randn(len(all_slots), num_kv_heads, head_dim, generator=gen)
            caches.append(cache.to(dtype=dtype, device=device))
        else:  # benchmark sizes: draw on the device, no slow host copy
            dev_gen = torch.Generator(device=device).manual_seed(seed + len(caches))
            caches.append(torch.randn(shape, generator=dev_gen, dtype=dtype, device=device))
    q_lens = [new for _, new in lens]
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    q = torch.randn(starts[-1], num_q_heads, head_dim, generator=gen)
    return PagedBatch(
        q=q.to(dtype=dtype, device=device),
        k_cache=caches[0],
        v_cache=caches[1],
        block_tables=block_tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
    )


def fused_new_kv(batch: PagedBatch, spare: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """The new tokens' K and V as the model leaves them for the extend kernel: [T, Hkv, D] views
    of fused qkv rows [T, (Hq + 2*Hkv) * D + spare] (q columns random, then k, then v, equal to
    the cache's values; spare columns keep rows unpacked, 8 keep them 16-byte aligned). Token
    rows past query_start_loc[-1] (padding) stay random."""
    num_tokens, num_q_heads, head_dim = batch.q.shape
    block_size, num_kv_heads = batch.k_cache.shape[1], batch.k_cache.shape[2]
    new = (batch.query_start_loc[1:] - batch.query_start_loc[:-1]).long()
    seq = torch.repeat_interleave(torch.arange(len(new), device=new.device), new)
    first = batch.query_start_loc[:-1].long()[seq]
    real = torch.arange(len(seq), device=new.device)  # token rows past the last sequence: padding
    pos = (batch.seq_lens.long() - new)[seq] + real - first
    pages = batch.block_tables.long()[seq, pos // block_size]
    slots = pages * block_size + pos % block_size
    kv_size = num_kv_heads * head_dim
    rows = torch.empty(
        num_tokens,
        num_q_heads * head_dim + 2 * kv_size + spare,
        dtype=batch.q.dtype,
        device=batch.q.device,
    )
    rows.normal_()
    k = rows[:, num_q_heads * head_dim :][:, :kv_size].view(num_tokens, num_kv_heads, head_dim)
    v = rows[:, num_q_heads * head_dim + kv_size :][:, :kv_size].view(
        num_tokens, num_kv_heads, head_dim
    )
    k[: len(seq)] = batch.k_cache.flatten(0, 1)[slots]
    v[: len(seq)] = batch.v_cache.flatten(0, 1)[slots]
    return k, v
