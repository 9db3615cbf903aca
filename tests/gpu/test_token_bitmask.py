"""Grammar bitmasks on logits: against a per-token reference, on random masks (CPU; CUDA too)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from troupe.gpu.token_bitmask import (
    allowed_ids,
    apply_token_bitmask,
    constrain_sampled,
    join_masks,
    step_bitmask,
    to_device,
)
from troupe.messages import SampledToken, TokenMasks


def _reference(logits: torch.Tensor, bitmask: np.ndarray) -> torch.Tensor:
    out = logits.clone()
    for row in range(logits.shape[0]):
        for token in range(logits.shape[1]):
            if not (int(bitmask[row, token // 32]) >> (token % 32)) & 1:
                out[row, token] = float("-inf")
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_apply_matches_reference(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA")
    rng = np.random.default_rng(0)
    vocab = 200  # not a multiple of 32: the last word is partial
    bitmask = rng.integers(-(2**31), 2**31, size=(5, 7), dtype=np.int64).astype(np.int32)
    bitmask[1] = -1  # an unconstrained row
    logits = torch.randn(5, vocab)
    got = apply_token_bitmask(logits.to(device), to_device(bitmask, torch.device(device)))
    assert torch.equal(got.cpu(), _reference(logits, bitmask))
    assert torch.equal(got[1].cpu(), logits[1])


def test_step_bitmask_lays_masks_over_sampled_rows() -> None:
    bits = np.array([[1, 2], [4, 8]], dtype=np.int32)
    masks = TokenMasks(step_id=1, request_ids=("a", "b"), num_words=2, bitmask=bits.tobytes())
    laid = step_bitmask(masks, ["x", "b", "a"])
    assert laid.tolist() == [[-1, -1], [4, 8], [1, 2]]
    assert allowed_ids(bits[1], 64).tolist() == [2, 35]


def test_joined_masks_lay_both_and_the_second_wins() -> None:
    ahead = TokenMasks(step_id=1, request_ids=("a", "b"), num_words=1, ahead=True,
                       bitmask=np.array([[1], [2]], np.int32).tobytes(), failed=(("b", "x"),))  # fmt: skip
    fresh = TokenMasks(step_id=2, request_ids=("b", "c"), num_words=1,
                       bitmask=np.array([[4], [8]], np.int32).tobytes())  # fmt: skip
    joined = join_masks(ahead, fresh)
    assert step_bitmask(joined, ["c", "a", "b", "z"]).tolist() == [[8], [1], [4], [-1]]
    assert joined.failed == (("b", "x"),)


def test_constrain_sampled_keeps_allowed_and_replaces_others() -> None:
    bits = np.zeros((1, 2), dtype=np.int32)
    bits[0, 1] = 0b101  # tokens 32 and 34
    masks = TokenMasks(step_id=1, request_ids=("a",), num_words=2, bitmask=bits.tobytes())
    out = constrain_sampled([SampledToken("a", 34), SampledToken("b", 7)], masks, 64)
    assert [s.token_id for s in out] == [34, 7]
    out = constrain_sampled([SampledToken("a", 5)], masks, 64)
    assert out[0].token_id in (32, 34)
