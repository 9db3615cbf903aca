"""Sampler: exact masks, penalties, logprobs, and seeded draws independent of the batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from troupe.gpu.request_states import RequestState
from troupe.gpu.runner import SequencesFailed
from troupe.gpu.sampler import (
    WITHHELD,
    SamplingBatch,
    apply_penalties,
    filter_logits,
    row_keys,
    sample,
    sampled_tokens,
    withhold_non_finite,
)
from troupe.gpu.sampling_batch import build_sampling_batch
from troupe.messages import FailedSeq, SampledToken, SamplingParams, SeqFailureReason

VOCAB = 8
LOGITS = torch.log(torch.tensor([[0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.015, 0.005]]))


def state(
    params: SamplingParams, tokens: list[int] = (), num_prompt: int = 0, seed: int = 7
) -> RequestState:
    buf = np.zeros(64, dtype=np.int64)
    buf[: len(tokens)] = tokens
    return RequestState(
        params=params,
        seed=seed,
        block_table=np.zeros(4, dtype=np.int32),
        tokens=buf,
        num_tokens=len(tokens),
        num_prompt_tokens=num_prompt,
    )


def batch_for(*params: SamplingParams, states: list[RequestState] | None = None) -> SamplingBatch:
    return build_sampling_batch(states or [state(p) for p in params], VOCAB, torch.device("cpu"))


def kept(params: SamplingParams, logits: torch.Tensor = LOGITS) -> list[int]:
    out = filter_logits(logits.clone(), batch_for(params))
    return torch.isfinite(out[0]).nonzero()[:, 0].tolist()


def test_top_k_top_p_min_p_masks() -> None:
    assert kept(SamplingParams(top_k=3)) == [0, 1, 2]
    assert kept(SamplingParams(top_k=0)) == list(range(VOCAB))
    # mass before token i: 0, .4, .65, .8 -> top_p 0.7 keeps tokens whose predecessors < 0.7
    assert kept(SamplingParams(top_p=0.7)) == [0, 1, 2]
    assert kept(SamplingParams(top_p=0.65)) == [0, 1]
    assert kept(SamplingParams(top_p=0.01)) == [0]
    # min_p 0.3: keep p >= 0.12 -> 0.4, 0.25, 0.15
    assert kept(SamplingParams(min_p=0.3)) == [0, 1, 2]
    assert kept(SamplingParams(top_k=4, min_p=0.5)) == [0, 1]


def test_top_p_after_temperature() -> None:
    # temperature 0.5 squares the ratios: the first two now hold 0.86 of the mass
    probs = (LOGITS / 0.5).softmax(-1)[0]
    assert probs[0] < 0.85 < probs[0] + probs[1]
    assert kept(SamplingParams(temperature=0.5, top_p=0.85)) == [0, 1]
    assert kept(SamplingParams(temperature=1.0, top_p=0.85)) == [0, 1, 2, 3]


def test_greedy_and_penalties() -> None:
    logits = torch.tensor([[2.0, 1.0, -1.0, 0.5, 0.0, 0.0, 0.0, 0.0]])
    params = SamplingParams(
        temperature=0.0, presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0
    )
    # prompt [3], output [0, 0, 2]
    st = state(params, [3, 0, 0, 2], num_prompt=1)
    out = apply_penalties(logits.clone(), batch_for(params, states=[st]))
    expected = [2.0 / 2 - 0.5 - 0.5, 1.0, -1.0 * 2 - 0.25 - 0.5, 0.5 / 2, 0, 0, 0, 0]
    assert out[0].tolist() == expected
    ids, _ = sample(logits, batch_for(params, states=[st]))
    assert ids.tolist() == [1]  # token 0 fell from 2.0 to 0.0 after the penalties


def test_logprobs_are_raw_log_softmax() -> None:
    params = SamplingParams(temperature=0.0, logprobs=2, repetition_penalty=3.0)
    st = state(params, [0], num_prompt=1)
    ids, logprobs = sample(LOGITS.clone(), batch_for(params, states=[st]))
    lp = logprobs[0]
    assert lp is not None and lp.token_id == ids.item() == 1
    assert math.isclose(lp.logprob, math.log(0.25), rel_tol=1e-5)
    assert [t for t, _ in lp.top] == [0, 1]
    assert math.isclose(lp.top[0][1], math.log(0.4), rel_tol=1e-5)
    none_ids, none_lp = sample(LOGITS.clone(), batch_for(SamplingParams(temperature=0.0)))
    assert none_lp == (None,) and none_ids.tolist() == [0]
    _, zero = sample(LOGITS.clone(), batch_for(SamplingParams(temperature=0.0, logprobs=0)))
    assert zero[0] is not None and zero[0].top == ()


def test_seeded_draws_ignore_batch_composition() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 1000, generator=gen)
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(6)]
    states = [state(p, [1] * (5 + i), seed=p.seed) for i, p in enumerate(params)]

    def draw(rows: list[int]) -> list[int]:
        batch = build_sampling_batch([states[r] for r in rows], 1000, torch.device("cpu"))
        return sample(logits[rows], batch)[0].tolist()

    full = draw([0, 1, 2, 3, 4, 5])
    assert draw([4, 1]) == [full[4], full[1]]
    assert draw([5]) == [full[5]]
    assert len(set(full)) > 3  # not collapsing to the argmax
    assert full != logits.argmax(-1).tolist()


def test_gumbel_draws_follow_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log()[None].repeat(4000, 1)
    keys = torch.tensor([row_keys(11, pos) for pos in range(4000)], dtype=torch.int64)
    batch = SamplingBatch(
        temperature=torch.ones(4000),
        top_k=torch.full((4000,), 3),
        top_p=torch.ones(4000),
        min_p=torch.zeros(4000),
        keys=keys,
        presence=torch.zeros(4000),
        frequency=torch.zeros(4000),
        repetition=torch.ones(4000),
        num_logprobs=(None,) * 4000,
    )
    counts = torch.bincount(sample(logits, batch)[0], minlength=3).float() / 4000
    assert torch.allclose(counts, probs, atol=0.03), counts


def test_rows_with_non_finite_logits_are_withheld_and_reported() -> None:
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 300, generator=generator) * 4
    logits[1, 7] = math.nan
    logits[3, 0] = math.inf
    logits[4, 299] = -math.inf
    logits[5] *= 1e30  # huge but finite: the row sum must not overflow into a false alarm
    params = [
        SamplingParams(temperature=0.0, logprobs=2),
        SamplingParams(temperature=0.9, seed=3),
        SamplingParams(temperature=0.7, seed=4, top_p=0.9),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.2, seed=5, top_k=10),
        SamplingParams(temperature=0.0),
    ]
    states = [state(p, [1, 2, 3], seed=p.seed or 0) for p in params]
    batch = build_sampling_batch(states, 300, torch.device("cpu"))
    token_ids, logprobs = sample(logits.clone(), batch)
    checked = withhold_non_finite(token_ids, logits).tolist()
    ids = token_ids.tolist()
    assert checked == [ids[0], WITHHELD, ids[2], WITHHELD, WITHHELD, ids[5]]
    assert ids[0] == int(logits[0].argmax()) and ids[5] == int(logits[5].argmax())
    # bf16 logits are checked the same way
    half = logits.bfloat16()
    assert withhold_non_finite(token_ids, half).tolist() == checked

    with pytest.raises(SequencesFailed) as info:
        sampled_tokens(list("abcdef"), checked, logprobs)
    assert info.value.sampled == (
        SampledToken("a", ids[0], logprobs[0]),
        SampledToken("c", ids[2], None),
        SampledToken("f", ids[5], None),
    )
    nan = SeqFailureReason.NON_FINITE_LOGITS
    assert info.value.failed == (FailedSeq("b", nan), FailedSeq("d", nan), FailedSeq("e", nan))
    assert "'b' (non-finite logits)" in str(info.value)
    # All finite: the plain tuple, nothing raised.
    assert sampled_tokens(["a", "c"], [ids[0], ids[2]], [logprobs[0], None]) == (
        SampledToken("a", ids[0], logprobs[0]),
        SampledToken("c", ids[2], None),
    )


def test_uniform_from_hash_stays_inside_the_open_interval() -> None:
    from troupe.gpu.sampler import uniform_from_hash

    u = uniform_from_hash(torch.tensor([0, 1, 2**31, 2**32 - 1], dtype=torch.int64))
    assert bool(((u > 0) & (u < 1)).all()), u
    assert torch.isfinite(-torch.log(-torch.log(u))).all()


def test_cpu_argmax_matches_torch_on_ties_and_nan() -> None:
    """The sampler's CPU argmax (numpy) picks what torch's does: the first of equal maxima, a
    NaN over any number, inf over finite."""
    from troupe.gpu.sampler import _argmax

    x = torch.randn(6, 1000, generator=torch.Generator().manual_seed(0))
    x[1, 10] = float("nan")
    x[2, 3] = x[2, 7] = 100.0
    x[3, 5] = float("inf")
    x[4, 9] = x[4, 2] = float("nan")
    x[5] = 1.0  # all tied
    got = _argmax(x)
    assert got.dtype == torch.int64
    assert got.tolist() == x.argmax(dim=-1).tolist() == [int(x[0].argmax()), 10, 3, 5, 2, 0]


def test_the_cpu_hash_is_the_int64_forms_bit_for_bit() -> None:
    """uniform_cpu (numpy uint32, in place) against the int64 torch definition the CUDA kernel
    follows, keys at both ends of 32 bits included; and the noise built from either."""
    from troupe.gpu.sampler import gumbel_noise, token_hash, uniform_cpu, uniform_from_hash

    keys = torch.randint(0, 2**32, (6, 2), generator=torch.Generator().manual_seed(3))
    keys[0] = torch.tensor([2**32 - 1, 2**32 - 1])
    keys[1] = torch.tensor([0, 0])
    for vocab in (7, 1000, 151936):
        want = uniform_from_hash(token_hash(keys, vocab))
        assert torch.equal(uniform_cpu(keys, vocab), want)
        assert torch.equal(gumbel_noise(keys, vocab), -torch.log(-torch.log(want)))
