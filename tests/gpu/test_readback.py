"""Sampled ids read back without waiting for the work queued after them (gpu/readback.py).

The runner queues the next forward right after a masked step's draw (the kept forward,
gpu/forward_ahead.py); under CUDA graphs that forward writes its logits into the buffer the
step's own non-finite check reads. The ids read back must be the step's own: copied out, and
checked against its logits, before anything else is queued.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from troupe.gpu.readback import Readback
from troupe.gpu.sampler import WITHHELD
from troupe.messages import SeqWork

from tests.gpu.test_overlap_step import GREEDY, make_runner

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture
def qwen3(hf_folder: Any) -> Path:
    folder, _ = hf_folder("qwen3", max_position_embeddings=128)
    return Path(folder)


@pytest.mark.parametrize("device", DEVICES)
def test_a_readback_keeps_the_ids_it_was_given(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    ids = torch.tensor([3, 1, 4, 1, 5], dtype=torch.int64, device=device)
    readback = Readback(ids)
    ids.fill_(-7)  # work queued after the copy
    assert readback.read() == [3, 1, 4, 1, 5]


def test_the_ids_read_back_are_checked_against_their_own_logits(qwen3: Path) -> None:
    """`early` (the next forward) overwrites the logits with NaN, as a graph replay into the
    same output buffer would: the step's token is still its own draw, not WITHHELD."""
    runner = make_runner(qwen3, overlap=True)
    work = SeqWork(
        request_id="a", token_ids=(5, 9, 2), start_pos=0, block_ids=(0,), reset=True,
        sample=True, params=GREEDY, num_prompt_tokens=3,
    )  # fmt: skip
    states = runner._states.apply((work,))
    logits = torch.randn(1, runner.vocab_size, generator=torch.Generator().manual_seed(0))
    expected = int(logits.argmax())
    seen: list[torch.Tensor] = []

    def early(device_ids: torch.Tensor) -> bool:
        seen.append(device_ids.clone())
        logits.fill_(float("nan"))  # the next forward's logits, in the same buffer
        return True

    token_ids, _, launched = runner._sample(logits, states, ["a"], early=early)
    assert launched and token_ids == [expected] != [WITHHELD]
    assert seen[0].tolist() == [expected]  # the next forward is fed the same draw
