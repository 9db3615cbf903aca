"""Grammar bitmasks on logits: against a per-token reference, on random masks (CPU; CUDA too)."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
import torch
from troupe.gpu.pinned_host import is_pinned, pin_host_buffer
from troupe.gpu.token_bitmask import (
    BitmaskUpload,
    allowed_ids,
    apply_token_bitmask,
    constrain_sampled,
    join_masks,
    mask_array,
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


def _shared_masks(buffer: mmap.mmap, request_ids: tuple[str, ...], words: int) -> TokenMasks:
    """Masks whose bits are a view of `buffer` (as the grammar process sends them)."""
    bits = np.frombuffer(buffer, np.int32, len(request_ids) * words).reshape(-1, words)
    bits[:] = np.arange(bits.size, dtype=np.int32).reshape(bits.shape) * 7 + 1
    return TokenMasks(step_id=1, request_ids=request_ids, num_words=words,
                      bitmask=memoryview(bits).cast("B"))  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("pinned", [False, True])
def test_for_rows_lays_the_rows_on_the_device(device: str, pinned: bool) -> None:
    """BitmaskUpload.for_rows equals step_bitmask in every order, from a page-locked view of a
    shared file (CUDA: a DMA from it and the rows laid out on the device) or not."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA")
    if pinned and device == "cpu":
        pytest.skip("page-locking is CUDA's")
    buffer = mmap.mmap(-1, 1 << 16)
    unpin = pin_host_buffer(buffer) if pinned else (lambda: None)
    try:
        masks = _shared_masks(buffer, ("a", "b", "c"), 5)
        assert is_pinned(mask_array(masks)) == pinned
        upload = BitmaskUpload(torch.device(device))
        joined = join_masks(masks, _shared_masks(mmap.mmap(-1, 4096), ("d",), 5))
        for given, order in (
            (masks, ["a", "b", "c"]),
            (masks, ["c", "a"]),
            (masks, ["x", "b", "c", "y", "a"]),
            (joined, ["d", "a", "z"]),
        ):
            got = upload.for_rows(given, order).cpu().numpy()
            assert got.tolist() == step_bitmask(given, order).tolist(), order
    finally:
        unpin()
    assert not is_pinned(mask_array(masks))
