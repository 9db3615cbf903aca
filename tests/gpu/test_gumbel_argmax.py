"""The fused Gumbel-max kernel (Triton interpreter on the CPU) draws what the torch path draws."""

from __future__ import annotations

import numpy as np
import torch
from troupe.gpu.gumbel_argmax import gumbel_argmax
from troupe.gpu.sampler import gumbel_noise, row_keys_array


def test_fused_draw_matches_torch_path() -> None:
    gen = torch.Generator().manual_seed(3)
    vocab = 2500  # more than one 2048-wide block, with a ragged tail
    logits = torch.randn(5, vocab, generator=gen) * 3
    logits[3, 100:] = float("-inf")  # a filtered row: only the first 100 ids can win
    temperature = torch.tensor([0.6, 1.0, 0.0, 1.5, 0.9])
    seeds = np.array([1, 2, 3, 4, 2**62 + 5], dtype=np.uint64)
    keys = torch.from_numpy(row_keys_array(seeds, np.array([7, 0, 9, 100, 40000], np.uint64)))
    noisy = logits / torch.where(temperature > 0, temperature, 1.0)[:, None]
    noisy = noisy + gumbel_noise(keys, vocab)
    expected = torch.where(temperature > 0, noisy.argmax(-1), logits.argmax(-1))
    got = gumbel_argmax(logits, temperature, keys)
    assert got.tolist() == expected.tolist()
    assert got[2].item() == logits[2].argmax().item()
    assert got[3].item() < 100
    assert got[0].item() != logits[0].argmax().item() or got[1] != logits[1].argmax()
