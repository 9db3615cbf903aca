"""logit_bias and min_tokens in the sampler (gpu/logit_edits.py): on the CPU, and on CUDA
(`-m gpu`), through build_sampling_batch as the runners call it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from troupe.gpu.request_states import RequestState
from troupe.gpu.sampler import sample
from troupe.gpu.sampling_batch import build_sampling_batch
from troupe.messages import SamplingParams

VOCAB = 16
EOS = 3
DEVICES = [
    pytest.param("cpu"),
    pytest.param("cuda", marks=pytest.mark.gpu),
]


def state(params: SamplingParams, num_tokens: int, num_prompt: int, seed: int = 5) -> RequestState:
    return RequestState(
        params=params,
        seed=seed,
        block_table=np.zeros(4, dtype=np.int32),
        num_tokens=num_tokens,
        num_prompt_tokens=num_prompt,
        eos_token_ids=(EOS,),
    )


def logits_favouring(token: int, rows: int, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(token)
    logits = torch.randn(rows, VOCAB, generator=gen)
    logits[:, token] = 20.0
    return logits.to(device)


def draw(states: list[RequestState], logits: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    batch = build_sampling_batch(states, VOCAB, logits.device)
    raw = logits.clone()
    ids, _ = sample(logits, batch)
    assert torch.equal(logits, raw), "the sampler must not edit the caller's logits"
    return ids.tolist(), raw


@pytest.mark.parametrize("device", DEVICES)
def test_logit_bias_moves_greedy_and_random_draws(device: str) -> None:
    logits = logits_favouring(7, 3, device)
    states = [
        state(SamplingParams(temperature=0.0, logit_bias={2: 100.0}), 10, 4),
        state(SamplingParams(temperature=0.8, logit_bias={7: -100.0, 9: 30.0}), 10, 4),
        state(SamplingParams(temperature=0.0), 10, 4),  # unbiased row: untouched
    ]
    ids, _ = draw(states, logits)
    assert ids == [2, 9, 7]


@pytest.mark.parametrize("device", DEVICES)
def test_logit_bias_is_added_before_penalties(device: str) -> None:
    """A small bias shifts the argmax only when it beats the gap (exact arithmetic)."""
    logits = torch.tensor([[1.0, 2.0, 1.5] + [0.0] * (VOCAB - 3)], device=device)
    for bias, expected in ((0.4, [1]), (0.6, [2])):
        params = SamplingParams(temperature=0.0, logit_bias={2: bias})
        assert draw([state(params, 5, 2)], logits)[0] == expected


@pytest.mark.parametrize("device", DEVICES)
def test_min_tokens_bans_eos_and_stop_ids_until_reached(device: str) -> None:
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=(11,))
    logits = logits_favouring(EOS, 1, device)
    logits[0, 11] = 19.0  # the runner-up is a stop token id too
    # prompt of 4 tokens: positions 4, 5, 6 sample outputs 1..3, position 7 the 4th
    for num_tokens, banned in ((4, True), (5, True), (6, True), (7, False)):
        ids, _ = draw([state(params, num_tokens, 4)], logits.clone())
        assert (ids[0] not in (EOS, 11)) if banned else ids == [EOS], num_tokens


@pytest.mark.parametrize("device", DEVICES)
def test_min_tokens_keeps_eos_when_ignored(device: str) -> None:
    """ignore_eos: EOS does not stop the request, so min_tokens has no reason to ban it."""
    params = SamplingParams(temperature=0.0, min_tokens=3, ignore_eos=True)
    ids, _ = draw([state(params, 4, 4)], logits_favouring(EOS, 1, device))
    assert ids == [EOS]


@pytest.mark.parametrize("device", DEVICES)
def test_min_tokens_rows_are_per_position_in_a_verification(device: str) -> None:
    """Proposals verified in one step: each row is banned by its own position's output count."""
    params = SamplingParams(temperature=0.0, min_tokens=2)
    s = state(params, 5, 4)  # one output so far: rows sample outputs 2, 3, 4
    logits = logits_favouring(EOS, 3, device)
    batch = build_sampling_batch([s, s, s], VOCAB, logits.device, np.array([0, 1, 2]))
    ids, _ = sample(logits, batch)
    assert ids.tolist()[0] != EOS and ids.tolist()[1:] == [EOS, EOS]


def test_logprobs_stay_raw_under_a_bias() -> None:
    logits = logits_favouring(7, 1, "cpu")
    params = SamplingParams(temperature=0.0, logit_bias={2: 100.0}, logprobs=1)
    batch = build_sampling_batch([state(params, 4, 2)], VOCAB, logits.device)
    ids, logprobs = sample(logits, batch)
    expected = logits.log_softmax(-1)[0]
    lp = logprobs[0]
    assert ids.tolist() == [2] and lp is not None
    assert lp.logprob == pytest.approx(float(expected[2]), abs=1e-5)
    assert lp.top[0][0] == 7
