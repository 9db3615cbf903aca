"""ModelRunner behaviour beyond greedy parity: seeds, logprobs, plan checks, release."""

from __future__ import annotations

import pytest
from troupe.messages import SamplingParams, SeqWork, StepPlan

PROMPT_A = [5, 17, 42, 99, 3, 250, 7]
PROMPT_B = [200, 1, 77, 13]


def test_seeded_sampling_is_batch_independent(hf_folder, mt) -> None:
    folder, _ = hf_folder("qwen2")
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=10)

    def generate(with_neighbour: bool) -> list[int]:
        driver = mt.PlanDriver(mt.runner_for(folder), chunk=3)
        if with_neighbour:
            driver.add("n", PROMPT_B, SamplingParams(temperature=0.8, seed=9))
        driver.add("s", PROMPT_A, params)
        driver.run(10)
        return driver.seqs["s"].output

    alone = generate(False)
    # a CPU pool is committed as written: the allocator reuses written blocks first
    assert mt.runner_for(folder).kv_pages_on_write
    assert alone == generate(True)
    greedy = mt.PlanDriver(mt.runner_for(folder), chunk=3)
    greedy.add("g", PROMPT_A)
    greedy.run(10)
    assert alone != greedy.seqs["g"].output  # sampling did sample


def test_logprobs_come_back(hf_folder, mt) -> None:
    folder, hf_model = hf_folder("llama")
    driver = mt.PlanDriver(mt.runner_for(folder), chunk=16)
    driver.add("a", PROMPT_A, SamplingParams(temperature=0.0, logprobs=3))
    token = driver.step()["a"]
    import torch

    with torch.no_grad():
        expected = hf_model(torch.tensor([PROMPT_A])).logits[0, -1].log_softmax(-1)
    assert token.logprob is not None and token.logprob.token_id == token.token_id
    assert token.logprob.logprob == pytest.approx(expected.max().item(), abs=1e-4)
    assert [t for t, _ in token.logprob.top] == expected.topk(3).indices.tolist()


def test_mid_prompt_chunk_samples_nothing_and_bad_plans_raise(hf_folder, mt) -> None:
    folder, _ = hf_folder("llama")
    runner = mt.runner_for(folder)
    params = SamplingParams(temperature=0.0)
    first = SeqWork(
        request_id="a",
        token_ids=(1, 2, 3),
        start_pos=0,
        block_ids=(0,),
        reset=True,
        sample=False,
        params=params,
        num_prompt_tokens=6,
    )
    assert runner.execute(StepPlan(step_id=1, seqs=(first,))) == ()
    too_far = SeqWork(request_id="a", token_ids=(4, 5, 6), start_pos=3)  # needs a second block
    with pytest.raises(ValueError, match="need 2 blocks"):
        runner.execute(StepPlan(step_id=2, seqs=(too_far,)))
    runner.execute(StepPlan(step_id=3, seqs=(), released=("a",)))
    with pytest.raises(ValueError, match="no params"):
        runner.execute(
            StepPlan(
                step_id=4,
                seqs=(SeqWork(request_id="a", token_ids=(4,), start_pos=3, block_ids=(1,)),),
            )
        )
