"""allowed_token_ids and bad_words in the sampler (gpu/token_bans.py, gpu/logit_edits.py): on
the CPU, and on CUDA (`-m gpu`), through build_sampling_batch as the runners call it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from troupe.gpu.request_states import RequestState
from troupe.gpu.sampler import sample
from troupe.gpu.sampling_batch import SamplingBatches, build_sampling_batch
from troupe.gpu.token_bans import bad_words, banned_words
from troupe.messages import SamplingParams

VOCAB = 16
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


def state(params: SamplingParams, history: list[int], num_prompt: int) -> RequestState:
    """A request whose positions hold `history` (prompt first); it samples the next one."""
    s = RequestState(
        params=params,
        seed=5,
        block_table=np.zeros(4, dtype=np.int32),
        num_tokens=len(history),
        num_prompt_tokens=num_prompt,
    )
    s.set_params(params, 32)
    if s.tokens is not None:
        s.tokens[: len(history)] = history
    return s


def ranked_logits(order: list[int], rows: int, device: str) -> torch.Tensor:
    """Logits whose best tokens are `order`, best first (random below them)."""
    logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(3))
    for rank, token in enumerate(order):
        logits[:, token] = 30.0 - rank
    return logits.to(device)


def test_banned_words_follow_vllm_rule() -> None:
    words = bad_words([(4,), (1, 2, 3), (9, 3)])
    assert words is not None and words.reads_history
    out = lambda *t: banned_words(words, np.array(t, np.int64)).tolist()  # noqa: E731
    assert out() == [4]  # only one-token words before any output
    assert out(1) == [4]
    assert sorted(out(7, 1, 2)) == [3, 4]  # ends with [1, 2]: 3 banned
    assert sorted(out(9)) == [3, 4]
    assert out(1, 2, 5) == [4]  # the prefix must end the output
    assert bad_words([]) is None


@pytest.mark.parametrize("device", DEVICES)
def test_allowed_token_ids_pick_the_best_allowed(device: str) -> None:
    logits = ranked_logits([7, 2, 11, 5], 3, device)
    states = [
        state(SamplingParams(temperature=0.0, allowed_token_ids=(5, 11)), [1, 1], 2),
        state(SamplingParams(temperature=0.9, allowed_token_ids=(0, 13)), [1, 1], 2),
        state(SamplingParams(temperature=0.0), [1, 1], 2),  # no set: untouched
    ]
    batch = build_sampling_batch(states, VOCAB, logits.device)
    ids, _ = sample(logits.clone(), batch)
    assert ids.tolist()[0] == 11 and ids.tolist()[1] in (0, 13) and ids.tolist()[2] == 7
    for seed in range(20):  # random draws stay in the set
        states[1].seed = seed
        batch = build_sampling_batch(states[1:2], VOCAB, logits.device)
        assert sample(logits[1:2].clone(), batch)[0].tolist()[0] in (0, 13)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_words_ban_a_word_end_after_its_start(device: str) -> None:
    params = SamplingParams(temperature=0.0, bad_words_token_ids=((7,), (2, 11)))
    logits = ranked_logits([7, 11, 5], 2, device)
    after_two = state(params, [3, 3, 2], 2)  # output [2]: 11 banned too
    after_other = state(params, [3, 2, 3], 2)  # output [3]: only 7 banned
    batch = build_sampling_batch([after_two, after_other], VOCAB, logits.device)
    assert sample(logits.clone(), batch)[0].tolist() == [5, 11]
    # the prompt does not count: the same 2 at the prompt's end leaves 11 allowed
    in_prompt = state(params, [3, 3, 2], 3)
    batch = build_sampling_batch([in_prompt], VOCAB, logits.device)
    assert sample(logits[:1].clone(), batch)[0].tolist() == [11]


def test_bad_word_rows_are_per_position_in_a_verification() -> None:
    """Proposals verified in one step: each row reads the history up to its own position."""
    params = SamplingParams(temperature=0.0, bad_words_token_ids=((2, 11),))
    s = state(params, [3, 3, 5, 2], 2)  # proposals after position 3: 2 at 4
    assert s.tokens is not None
    s.tokens[4] = 9
    logits = ranked_logits([11, 5], 3, "cpu")
    batch = build_sampling_batch([s, s], VOCAB, logits.device, np.array([0, 1]))
    assert sample(logits[:2].clone(), batch)[0].tolist() == [5, 11]


def test_logprobs_stay_raw_under_the_mask() -> None:
    logits = ranked_logits([7, 2], 1, "cpu")
    params = SamplingParams(temperature=0.0, allowed_token_ids=(2,), logprobs=1)
    batch = build_sampling_batch([state(params, [1], 1)], VOCAB, logits.device)
    ids, logprobs = sample(logits, batch)
    lp = logprobs[0]
    assert ids.tolist() == [2] and lp is not None
    assert lp.logprob == pytest.approx(float(logits.log_softmax(-1)[0, 2]), abs=1e-5)
    assert lp.top[0][0] == 7


def test_batches_with_bad_words_are_never_reused() -> None:
    """A step with no bad-word match must not hand its (edit-free) settings to the next."""
    params = SamplingParams(temperature=0.0, bad_words_token_ids=((2, 11),))
    s = state(params, [3, 3], 2)
    batches = SamplingBatches(VOCAB, torch.device("cpu"))
    logits = ranked_logits([11, 5], 1, "cpu")
    assert sample(logits.clone(), batches.build([s]))[0].tolist() == [11]
    assert s.tokens is not None
    s.tokens[2], s.num_tokens = 2, 3  # it sampled 2: 11 is now banned
    assert sample(logits.clone(), batches.build([s]))[0].tolist() == [5]
    assert batches.num_reused == 0


def test_params_bound_the_fields() -> None:
    from troupe.messages import ParamError

    for params, field in (
        (SamplingParams(allowed_token_ids=()), "allowed_token_ids"),
        (SamplingParams(allowed_token_ids=(VOCAB,)), "allowed_token_ids"),
        (SamplingParams(allowed_token_ids=tuple(range(1025))), "allowed_token_ids"),
        (SamplingParams(bad_words=(" ",)), "bad_words"),
        (SamplingParams(bad_words=("x",) * 129), "bad_words"),
        (SamplingParams(bad_words=("x",), bad_words_token_ids=((VOCAB,),)), "bad_words"),
        (SamplingParams(truncate_prompt_tokens=0), "truncate_prompt_tokens"),
        (SamplingParams(truncate_prompt_tokens=-2), "truncate_prompt_tokens"),
    ):
        with pytest.raises(ParamError) as info:
            params.check(vocab_size=VOCAB)
        assert info.value.field == field, params
    SamplingParams(allowed_token_ids=(3,), bad_words=("x",), truncate_prompt_tokens=-1).check(
        vocab_size=VOCAB
    )
