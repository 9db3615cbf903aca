"""ops/h200_standin.py's folded block tables: every id lands in the small pool (the id modulo its
size), padding stays padding, and a decode over the folded tables reads only the pool's blocks
(the torch reference gives the same answer when every block outside the pool is NaN)."""

import math

import torch
from troupe.kernels import reference
from troupe.kernels.paged_batch import PADDING_BLOCK_ID, make_paged_batch
from troupe.ops.h200_standin import folded_tables


def test_folded_tables_stay_in_the_pool_and_keep_padding() -> None:
    batch = make_paged_batch([(40, 1), (7, 1), (100, 1)], num_q_heads=4, num_kv_heads=2,
                             head_dim=16, block_size=4, dtype=torch.float32, device="cpu", seed=1)  # fmt: skip
    bt = batch.block_tables
    folded = folded_tables(bt, 5)
    padding = bt == PADDING_BLOCK_ID
    assert padding.any(), "the shortest sequence's row is padded"
    assert torch.equal(folded[padding], bt[padding])
    assert int(folded[~padding].max()) < 5 and int(folded[~padding].min()) >= 0
    assert torch.equal(folded[~padding], bt[~padding] % 5)


def test_a_decode_over_folded_tables_reads_only_the_pool() -> None:
    batch = make_paged_batch([(63, 1)] * 3, num_q_heads=4, num_kv_heads=2, head_dim=16,
                             block_size=4, dtype=torch.float32, device="cpu", seed=2)  # fmt: skip
    folded = folded_tables(batch.block_tables, 6)
    rest = (batch.seq_lens, 1 / math.sqrt(16), batch.max_seq_len)
    got = reference.paged_decode_attention(batch.q, batch.k_cache, batch.v_cache, folded, *rest)
    poisoned_k, poisoned_v = batch.k_cache.clone(), batch.v_cache.clone()
    poisoned_k[6:], poisoned_v[6:] = float("nan"), float("nan")  # blocks outside the pool
    want = reference.paged_decode_attention(batch.q, poisoned_k, poisoned_v, folded, *rest)
    assert not want.isnan().any()
    assert torch.equal(got, want)
