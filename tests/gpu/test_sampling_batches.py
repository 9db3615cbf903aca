"""SamplingBatches: a run of steps over the same requests (or some of them, in any order) reuses
the uploaded settings, and every batch it returns equals what build_sampling_batch builds from
scratch (CPU)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from troupe.gpu.request_states import RequestState
from troupe.gpu.sampler import SamplingBatch
from troupe.gpu.sampling_batch import SamplingBatches, build_sampling_batch
from troupe.messages import SamplingParams

VOCAB = 50
CPU = torch.device("cpu")


def state(params: SamplingParams, seed: int, num_tokens: int) -> RequestState:
    return RequestState(
        params=params,
        seed=seed,
        block_table=np.zeros(4, dtype=np.int32),
        tokens=np.arange(64, dtype=np.int64) % VOCAB,
        num_tokens=num_tokens,
        num_prompt_tokens=3,
    )


def assert_same(got: SamplingBatch, want: SamplingBatch) -> None:
    for field in dataclasses.fields(SamplingBatch):
        a, b = getattr(got, field.name), getattr(want, field.name)
        if isinstance(a, torch.Tensor):
            assert isinstance(b, torch.Tensor) and torch.equal(a, b), field.name
        elif field.name != "logit_edits":
            assert a == b, field.name
        else:
            assert (a is None) == (b is None), field.name


def advance(states: list[RequestState]) -> None:
    for s in states:
        s.num_tokens += 1


def test_a_run_of_steps_reuses_settings_and_rehashes_keys() -> None:
    params = [SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=0.0)]
    states = [state(p, seed, 10 + seed) for seed, p in enumerate(params)]
    batches = SamplingBatches(VOCAB, CPU)
    first = batches.build(states)
    assert_same(first, build_sampling_batch(states, VOCAB, CPU))
    first.token_bitmask = torch.zeros(2, 2, dtype=torch.int32)  # a caller's masks stay its own
    for _ in range(3):
        advance(states)
        got = batches.build(states)
        want = build_sampling_batch(states, VOCAB, CPU)
        assert_same(got, want)
        assert not torch.equal(got.keys, first.keys)  # the positions moved
    assert batches.num_reused == 3


def test_new_params_other_rows_or_penalties_rebuild() -> None:
    plain = SamplingParams(temperature=0.5)
    states = [state(plain, 1, 8), state(plain, 2, 9)]
    batches = SamplingBatches(VOCAB, CPU)
    batches.build(states)
    # params arrive anew for a row (the same state object): its settings must not be reused
    states[1].set_params(SamplingParams(temperature=1.5, top_p=0.5), max_model_len=64)
    advance(states)
    assert_same(batches.build(states), build_sampling_batch(states, VOCAB, CPU))
    assert batches.num_reused == 0
    # a row not in the last batch
    other = [states[0], state(plain, 4, 5)]
    assert_same(batches.build(other), build_sampling_batch(other, VOCAB, CPU))
    assert batches.num_reused == 0
    # penalties read each row's history up to its position: never reused
    penalized = [state(SamplingParams(temperature=0.5, presence_penalty=0.5), 3, 6)]
    batches.build(penalized)
    advance(penalized)
    got = batches.build(penalized)
    assert_same(got, build_sampling_batch(penalized, VOCAB, CPU))
    assert got.output_counts is not None
    assert batches.num_reused == 0


def test_fewer_rows_in_another_order_gather_the_settings() -> None:
    """Requests that ended leave the batch: the others' settings are gathered, the flags are
    the remaining rows' own (no top-k once its only row is gone), as built from scratch."""
    params = [
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=0.0, logprobs=2),
        SamplingParams(temperature=0.9, top_p=0.5),
    ]
    states = [state(p, seed, 10 + seed) for seed, p in enumerate(params)]
    batches = SamplingBatches(VOCAB, CPU)
    batches.build(states)
    for rows in ([2, 1], [1], [2, 0, 1], []):
        advance(states)
        picked = [states[r] for r in rows]
        assert_same(batches.build(picked), build_sampling_batch(picked, VOCAB, CPU))
    assert batches.num_reused == 4
    assert not build_sampling_batch([states[2], states[1]], VOCAB, CPU).use_top_k
