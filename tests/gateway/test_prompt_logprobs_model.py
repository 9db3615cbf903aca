"""lm-evaluation-harness's loglikelihood request on the real default model (SmolLM2 on the CPU),
through the official `openai` client: completions' echo with logprobs scores the prompt. The
scores must agree with the `prompt_logprobs` extra and, independently, with the logprobs of
tokens the model generates from the same prefixes (a decode step's sampler, not the scored
prompt rows)."""

from __future__ import annotations

from typing import Any

import pytest
from openai import OpenAI

from tests.gateway.conftest import ServerThread

CONTEXT = "The capital of France is"
CONTINUATION = " Paris"


@pytest.fixture(scope="module")
def client(smol: ServerThread) -> OpenAI:
    return OpenAI(base_url=f"{smol.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_lm_eval_loglikelihood_request(smol: ServerThread, client: OpenAI) -> None:
    model = smol.engine.model_name
    tokenizer = smol.engine.tokenizer
    prompt = CONTEXT + CONTINUATION
    ids = tokenizer.encode(prompt, True)
    # what lm-eval's local-completions model sends for loglikelihood
    out = client.completions.create(
        model=model, prompt=prompt, max_tokens=1, logprobs=1, echo=True, temperature=0
    )
    logprobs = out.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    assert logprobs.text_offset is not None
    num = len(ids)
    assert logprobs.tokens[:num] == [tokenizer.decode([t], False) for t in ids]
    assert len(logprobs.tokens) == num + 1  # and the one generated token
    assert out.choices[0].text.startswith(prompt)
    assert logprobs.text_offset[num] == len(prompt)
    prompt_lps = logprobs.token_logprobs[:num]
    assert prompt_lps[0] is None and all(lp is not None and lp < 0 for lp in prompt_lps[1:])
    # lm-eval's is_greedy: the continuation's token is the top one (its dict: it alone)
    assert logprobs.top_logprobs[num - 1] == {CONTINUATION: prompt_lps[-1]}

    # the same scores as the prompt_logprobs extra, position by position
    scored = client.completions.create(
        model=model, prompt=prompt, max_tokens=1, temperature=0, extra_body={"prompt_logprobs": 1}
    )
    extra: list[Any] = scored.choices[0].model_extra["prompt_logprobs"]  # type: ignore[index]
    assert extra[0] is None
    assert [e[str(t)]["logprob"] for e, t in zip(extra[1:], ids[1:], strict=True)] == prompt_lps[1:]

    # independently: each position's logprob is what decoding that token from the prefix
    # gives (greedy, so the first generated token is the top one there)
    for position in (num - 1, num - 2):
        prefix = ids[:position]
        step = client.completions.create(
            model=model, prompt=prefix, max_tokens=1, logprobs=1, temperature=0
        )
        step_lps = step.choices[0].logprobs
        assert step_lps is not None and step_lps.token_logprobs is not None
        greedy = tokenizer.encode(step.choices[0].text, False)
        if greedy == [ids[position]]:  # the prompt's token is the greedy one there
            assert step_lps.token_logprobs[0] == pytest.approx(prompt_lps[position], abs=2e-3)
        top = logprobs.top_logprobs[position]
        assert top is not None and max(top.values()) == pytest.approx(
            step_lps.token_logprobs[0], abs=2e-3
        )
