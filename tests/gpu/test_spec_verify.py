"""Verifying proposals on the real runner (tiny random models, CPU): the tokens and logprobs
equal decoding one token per step, for greedy, seeded sampling with filters, and penalties
(which must count accepted proposals as output); and the sampled distribution is the
target's (chi-square against transformers' probabilities)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from troupe.messages import SampledToken, SamplingParams, SeqWork, StepPlan

MAX_LEN = 64
BS = 4


class Driver:
    """Each request gets its whole table up front; proposals come from a callback."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.step_id = 0
        self.next_block = 0

    def plan(self, seqs: list[SeqWork]) -> tuple[SampledToken, ...]:
        self.step_id += 1
        out: tuple[SampledToken, ...] = self.runner.execute(
            StepPlan(step_id=self.step_id, seqs=tuple(seqs))
        )
        return out

    def start(self, rid: str, prompt: list[int], params: SamplingParams) -> SampledToken:
        blocks = tuple(range(self.next_block, self.next_block + MAX_LEN // BS))
        self.next_block += len(blocks)
        work = SeqWork(
            request_id=rid,
            token_ids=tuple(prompt),
            start_pos=0,
            block_ids=blocks,
            reset=True,
            params=params,
            num_prompt_tokens=len(prompt),
        )
        return self.plan([work])[0]

    def decode(self, rid: str, tokens: list[int], draft: tuple[int, ...]) -> SampledToken:
        work = SeqWork(
            request_id=rid,
            token_ids=(tokens[-1],),
            start_pos=len(tokens) - 1,
            draft_token_ids=draft,
        )
        return self.plan([work])[0]


def generate(runner: Any, prompt: list[int], params: SamplingParams, n: int, propose: Any):  # type: ignore[no-untyped-def]
    """n tokens (and their logprobs) decoding with `propose(tokens) -> draft`."""
    d = Driver(runner)
    first = d.start("r", prompt, params)
    out, lps, accepted = [first.token_id], [first.logprob], 0
    while len(out) < n:
        tokens = prompt + out
        draft = propose(tokens)[: n - len(out) - 1]
        got = d.decode("r", tokens, draft)
        assert got.more == draft[: len(got.more)] or not got.more or got.token_id == draft[0]
        new = [got.token_id, *got.more]
        assert new[: len(got.more)] == list(draft[: len(got.more)])
        accepted += len(got.more)
        out += new
        lps += [got.logprob, *got.more_logprobs]
    return out[:n], lps[:n], accepted


PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=64),
    SamplingParams(temperature=0.9, seed=11, top_k=20, top_p=0.9, logprobs=2, max_tokens=64),
    SamplingParams(
        temperature=0.7,
        seed=5,
        repetition_penalty=1.3,
        frequency_penalty=0.4,
        presence_penalty=0.3,
        max_tokens=64,
    ),
    SamplingParams(temperature=0.0, repetition_penalty=1.5, logprobs=0, max_tokens=64),
]


@pytest.mark.parametrize(
    "params", PARAMS, ids=["greedy", "seeded-filters", "penalties", "greedy-rep"]
)
def test_verified_tokens_equal_one_at_a_time(
    mt: SimpleNamespace, hf_folder: Any, params: SamplingParams
) -> None:
    folder, _ = hf_folder("llama")
    prompt = [5, 17, 99, 3, 42, 17, 99, 3]
    n = 24
    ref, ref_lps, _ = generate(
        mt.runner_for(folder, block_size=BS, max_model_len=MAX_LEN), prompt, params, n, lambda t: ()
    )

    def propose(tokens: list[int]) -> tuple[int, ...]:
        # the reference's next tokens, the third one wrong every other step
        done = len(tokens) - len(prompt)
        draft = list(ref[done : done + 4])
        if done % 2 and len(draft) > 2:
            draft[2] = (draft[2] + 1) % 256
        return tuple(draft)

    got, lps, accepted = generate(
        mt.runner_for(folder, block_size=BS, max_model_len=MAX_LEN), prompt, params, n, propose
    )
    assert got == ref
    assert accepted >= n // 2  # proposals were accepted, several per step
    for a, b in zip(lps, ref_lps, strict=True):
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert a.token_id == b.token_id
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]


def test_sampled_distribution_is_the_target(mt: SimpleNamespace, hf_folder: Any) -> None:
    """Many seeds, one proposal d: the first token follows p(. | prompt) (d included, with its
    own probability), and after an accepted d the next follows p(. | prompt, d). A rule that
    accepted d too often, resampled d after rejecting it, or scored row 1 without d, fails."""
    folder, hf = hf_folder("llama", vocab_size=16, std=0.35)
    prompt = [3, 7, 1, 12, 5]
    with torch.no_grad():
        p0 = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1], -1).numpy()
        d = int(np.argsort(p0)[-2])  # a likely token, not the likeliest
        p1 = torch.softmax(hf(torch.tensor([[*prompt, d]])).logits[0, -1], -1).numpy()
    num = 1200
    runner = mt.runner_for(folder, block_size=BS, max_model_len=16, num_gpu_blocks=num * 4)
    driver = Driver(runner)
    starts, decodes = [], []
    for i in range(num):
        rid = f"r{i}"
        blocks = tuple(range(4 * i, 4 * i + 4))
        params = SamplingParams(temperature=1.0, seed=1000 + i, max_tokens=4)
        starts.append(
            SeqWork(
                request_id=rid,
                token_ids=tuple(prompt[:-1]),
                start_pos=0,
                block_ids=blocks,
                reset=True,
                sample=False,
                params=params,
                num_prompt_tokens=len(prompt),
            )
        )
        decodes.append(
            SeqWork(
                request_id=rid,
                token_ids=(prompt[-1],),
                start_pos=len(prompt) - 1,
                draft_token_ids=(d,),
            )
        )
    driver.plan(starts)
    results = driver.plan(decodes)
    first = np.array([r.token_id for r in results])
    second = np.array([r.more[0] for r in results if r.more])
    assert all(len(r.more) == (r.token_id == d) for r in results)
    assert _chi_square_p(first, p0) > 1e-3
    assert _chi_square_p(second, p1) > 1e-3
    # and the test has power: the wrong distribution is rejected
    assert _chi_square_p(second, p0) < 1e-3


def _chi_square_p(samples: np.ndarray, probs: np.ndarray) -> float:
    """p-value of samples ~ probs, bins with expected count < 5 merged into one."""
    counts = np.bincount(samples, minlength=len(probs)).astype(float)
    expected = probs * len(samples)
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    exp = exp * obs.sum() / exp.sum()
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1  # the survival function of chi-square(df): Q(df / 2, stat / 2)
    return float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(stat / 2)))
