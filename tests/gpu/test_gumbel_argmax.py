"""The fused Gumbel-max kernel (Triton interpreter on the CPU) draws what the torch path draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import troupe.gpu.gumbel_argmax as gumbel_module
from triton_compiles import triton_compiles
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


def test_fused_draw_under_a_token_bitmask_matches_the_masked_torch_path() -> None:
    """Structured output: the kernel reads each token's bit (gpu/token_bitmask.py's layout)
    and draws what apply_token_bitmask then the torch path draw."""
    from troupe.gpu.token_bitmask import apply_token_bitmask

    gen = torch.Generator().manual_seed(5)
    vocab = 2500
    words = -(-vocab // 32) + 1  # a padded last word, as xgrammar allocates
    logits = torch.randn(6, vocab, generator=gen) * 3
    temperature = torch.tensor([0.7, 0.0, 1.2, 0.0, 0.9, 1.0])
    seeds = np.array([11, 12, 13, 14, 15, 16], dtype=np.uint64)
    keys = torch.from_numpy(row_keys_array(seeds, np.arange(6, dtype=np.uint64)))
    bits = torch.rand(6, words * 32, generator=gen) < 0.1  # a tenth of the tokens allowed
    bits[1, :] = False
    bits[1, 1234] = True  # one token allowed, greedy
    bits[3, :] = True  # unconstrained, greedy: the plain argmax
    bits[5, :] = False  # nothing allowed: argmax of an all -inf row is 0
    packed = (bits.view(6, words, 32).long() << torch.arange(32)).sum(-1)
    bitmask = packed.to(torch.int64).sub(((packed >> 31) & 1) << 32).to(torch.int32)
    masked = apply_token_bitmask(logits, bitmask)
    noisy = masked / torch.where(temperature > 0, temperature, 1.0)[:, None]
    noisy = noisy + gumbel_noise(keys, vocab)
    expected = torch.where(temperature > 0, noisy.argmax(-1), masked.argmax(-1))
    got = gumbel_argmax(logits, temperature, keys, bitmask)
    assert got.tolist() == expected.tolist()
    assert got[1].item() == 1234 and got[5].item() == 0
    assert got[3].item() == logits[3].argmax().item()
    assert all(bits[r, got[r]] for r in (0, 2, 4))  # drawn among the allowed


def test_warm_up_launches_every_form_a_step_may_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """warm_up (run at a CUDA runner's start) launches the kernels with and without a bitmask of
    the vocabulary's width, in the logits' dtype, and at a row count of every merge width that
    draws of up to max_rows rows use, so none compiles inside a request (a cold engine's first
    burst compiled four widths: docs/benchmarks.md, session 27); here in the interpreter."""
    seen: list[tuple[int, int, torch.dtype, tuple[int, ...] | None]] = []
    real = gumbel_module.gumbel_argmax

    def spy(logits: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor, bitmask=None):  # type: ignore[no-untyped-def]
        shape = None if bitmask is None else tuple(bitmask.shape)
        seen.append((logits.shape[0], logits.shape[1], logits.dtype, shape))
        return real(logits, temperature, keys, bitmask)

    cpu = torch.device("cpu")
    vocab, max_rows = 9000, 40  # five splits for one row here (num_splits' rule on the CPU)
    monkeypatch.setattr(gumbel_module, "gumbel_argmax", spy)
    gumbel_module.warm_up(vocab, cpu, torch.bfloat16, max_rows)
    rows = gumbel_module.warm_up_rows(max_rows, vocab, cpu)
    words = -(-vocab // 32)
    assert seen == [(n, vocab, torch.bfloat16, shape) for n in rows for shape in (None, (n, words))]
    width = [gumbel_module.merge_width(gumbel_module.split_shape(n, vocab, cpu)[0]) for n in rows]
    every = {
        gumbel_module.merge_width(gumbel_module.split_shape(n, vocab, cpu)[0])
        for n in range(1, max_rows + 1)
    }
    assert len(every) > 1 and sorted(width, reverse=True) == sorted(every, reverse=True)


def test_merge_width_is_the_next_power_of_two() -> None:
    assert [gumbel_module.merge_width(s) for s in (1, 2, 3, 5, 8, 9, 75)] == [
        1,
        2,
        4,
        8,
        8,
        16,
        128,
    ]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_draw_compiles_after_warm_up() -> None:
    """After warm_up, draws of any row count up to max_rows (with and without a bitmask)
    compile no kernel: counted by Triton's post-compile hook."""
    device = torch.device("cuda")
    vocab, max_rows = 151_936, 256
    gumbel_module.warm_up(vocab, device, torch.bfloat16, max_rows)
    with triton_compiles() as compiled:
        for n in (1, 2, 7, 14, 15, 30, 31, 60, 66, 100, 128, 200, 255, 256):
            logits = torch.randn(n, vocab, device=device, dtype=torch.bfloat16)
            temperature = torch.full((n,), 0.7, device=device)
            keys = torch.arange(2 * n, device=device).view(n, 2)
            gumbel_argmax(logits, temperature, keys)
            full = torch.full((n, -(-vocab // 32)), -1, dtype=torch.int32, device=device)
            gumbel_argmax(logits, temperature, keys, full)
        torch.cuda.synchronize()
    assert compiled == []


def test_split_rows_merge_to_the_lowest_id_of_the_top_value() -> None:
    """Each row's ids are split over programs (num_splits); the merge keeps torch.argmax's
    answer: the lowest id among equal maxima, wherever the splits fall, and 0 for a row of
    -inf."""
    vocab = 9000  # five blocks of ids: five splits for one row here, the last one ragged
    assert gumbel_module.num_splits(1, vocab, torch.device("cpu")) == 5
    logits = torch.zeros(4, vocab)
    logits[0, 2100] = logits[0, 6500] = 3.0  # a tie across splits: 2100
    logits[1, 8999] = 1.0  # the last id of the ragged split
    logits[2, :] = float("-inf")
    logits[3, 4096] = logits[3, 4097] = 2.0  # a tie inside one split: 4096
    zeros = torch.zeros(4)
    keys = torch.zeros(4, 2, dtype=torch.int64)
    got = gumbel_argmax(logits, zeros, keys)
    assert got.tolist() == [2100, 8999, 0, 4096] == logits.argmax(-1).tolist()
    # sampled rows over several splits agree with the torch path too
    gen = torch.Generator().manual_seed(9)
    noisy_logits = torch.randn(3, vocab, generator=gen)
    temperature = torch.tensor([0.5, 1.0, 2.0])
    seeds = np.array([21, 22, 23], dtype=np.uint64)
    keys = torch.from_numpy(row_keys_array(seeds, np.array([1, 2, 3], np.uint64)))
    expected = (noisy_logits / temperature[:, None] + gumbel_noise(keys, vocab)).argmax(-1)
    assert gumbel_argmax(noisy_logits, temperature, keys).tolist() == expected.tolist()
