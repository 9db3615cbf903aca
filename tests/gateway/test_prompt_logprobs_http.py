"""The prompt's logprobs over HTTP, in vLLM's shapes, on the fake runner behind a real server
(the engine in its child process, as `troupe serve` runs it): completions' echo with logprobs
(whole, streamed, max_tokens 0, token-id prompts, a list of prompts with n > 1) and the
`prompt_logprobs` extra on completions and chat. The expected values are the engine's own
(SamplingParams.prompt_logprobs through the Python API), so a shifted or dropped position fails.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from itertools import accumulate
from typing import Any

import pytest
from openai import OpenAI
from troupe.messages import Delta, Finished, SamplingParams, TokenLogprob

from tests.gateway.conftest import ServerThread

PROMPT = "Scores for every word of this prompt"


@pytest.fixture(scope="module")
def client(server: ServerThread) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def _post(server: ServerThread, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST JSON; (status, JSON body, or the SSE text of a stream)."""
    data = json.dumps({"model": server.engine.model_name, **body}).encode()
    request = urllib.request.Request(
        f"{server.url}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            return response.status, text if body.get("stream") else json.loads(text)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _chunks(sse: str) -> list[dict[str, Any]]:
    frames = [f.removeprefix("data: ") for f in sse.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


def _engine_scores(server: ServerThread, prompt: Any, k: int) -> tuple[TokenLogprob, ...]:
    """The engine's own prompt logprobs (its first event's)."""

    async def run() -> tuple[TokenLogprob, ...]:
        params = SamplingParams(max_tokens=1, prompt_logprobs=k)
        events = [e async for e in server.engine.generate(prompt, params)]
        first = events[0]
        assert isinstance(first, Delta | Finished) and first.prompt_logprobs is not None
        return first.prompt_logprobs

    scores: tuple[TokenLogprob, ...] = server.call(run())
    return scores


def _text(server: ServerThread, token_id: int) -> str:
    return server.engine.tokenizer.decode([token_id], False)


def _top(server: ServerThread, entry: TokenLogprob) -> dict[str, float]:
    """vLLM's top_logprobs entry: the chosen token first, then the top alternatives."""
    top = {_text(server, entry.token_id): entry.logprob}
    top.update({_text(server, t): v for t, v in entry.top})
    return top


def _check_echo(server: ServerThread, logprobs: dict[str, Any], prompt: Any, k: int) -> int:
    """The prompt's rows lead `logprobs`; their number."""
    ids = prompt if isinstance(prompt, list) else server.engine.tokenizer.encode(prompt, True)
    scores = _engine_scores(server, prompt, k)
    assert [e.token_id for e in scores] == ids[1:]
    num = len(ids)
    assert logprobs["tokens"][:num] == [_text(server, t) for t in ids]
    assert logprobs["token_logprobs"][:num] == [None, *(e.logprob for e in scores)]
    assert logprobs["top_logprobs"][0] is None
    for entry, top in zip(scores, logprobs["top_logprobs"][1:num], strict=True):
        assert list(top.items()) == list(_top(server, entry).items())  # chosen first, in order
        assert len(top) in (k, k + 1)
    return num


def _check_offsets(logprobs: dict[str, Any], text: str) -> None:
    tokens = logprobs["tokens"]
    assert "".join(tokens) == text
    assert logprobs["text_offset"] == [0, *accumulate(len(t) for t in tokens[:-1])]


def test_echo_with_logprobs_leads_with_the_prompts_rows(server: ServerThread) -> None:
    """lm-evaluation-harness's loglikelihood request, and the same with more tokens and k."""
    for max_tokens, k in ((1, 1), (4, 3)):
        body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "logprobs": k}
        status, plain = _post(server, "/v1/completions", {**body, "ignore_eos": True})
        assert status == 200
        status, out = _post(server, "/v1/completions", {**body, "echo": True, "ignore_eos": True})
        assert status == 200
        choice, generated = out["choices"][0], plain["choices"][0]
        assert choice["text"] == PROMPT + generated["text"]
        logprobs = choice["logprobs"]
        num = _check_echo(server, logprobs, PROMPT, k)
        for key in ("tokens", "token_logprobs", "top_logprobs"):
            assert logprobs[key][num:] == generated["logprobs"][key]
        _check_offsets(logprobs, choice["text"])
        assert logprobs["text_offset"][num] == len(PROMPT)
        # vLLM also returns the prompt_logprobs it computed for the echo
        assert len(choice["prompt_logprobs"]) == num and choice["prompt_logprobs"][0] is None
        assert out["usage"]["completion_tokens"] == max_tokens


def test_echo_with_logprobs_streams_the_prompt_first(server: ServerThread) -> None:
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 2, "echo": True}
    _, whole = _post(server, "/v1/completions", {**body, "ignore_eos": True})
    status, sse = _post(server, "/v1/completions", {**body, "ignore_eos": True, "stream": True})
    assert status == 200
    choices = [c["choices"][0] for c in _chunks(sse)]
    first = choices[0]
    assert first["text"] == PROMPT
    num = _check_echo(server, first["logprobs"], PROMPT, 2)
    assert len(first["logprobs"]["tokens"]) == num  # the first chunk: the prompt's rows only
    expected = whole["choices"][0]
    assert "".join(c["text"] for c in choices) == expected["text"]
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        streamed = [row for c in choices if c["logprobs"] for row in c["logprobs"][key]]
        assert streamed == expected["logprobs"][key], key
    assert choices[-1]["finish_reason"] == "length"


def test_echo_with_max_tokens_0_is_the_prompt_alone(server: ServerThread) -> None:
    """vLLM's scoring request: the engine runs one token, the answer shows only the prompt."""
    body = {"prompt": PROMPT, "max_tokens": 0, "logprobs": 0, "echo": True}
    status, out = _post(server, "/v1/completions", body)
    assert status == 200
    choice = out["choices"][0]
    assert choice["text"] == PROMPT
    num = _check_echo(server, choice["logprobs"], PROMPT, 0)
    assert len(choice["logprobs"]["tokens"]) == num
    _check_offsets(choice["logprobs"], PROMPT)
    status, sse = _post(server, "/v1/completions", {**body, "stream": True})
    assert status == 200
    choices = [c["choices"][0] for c in _chunks(sse)]
    assert "".join(c["text"] for c in choices) == PROMPT
    streamed = [t for c in choices if c["logprobs"] for t in c["logprobs"]["tokens"]]
    assert streamed == choice["logprobs"]["tokens"]
    assert choices[-1]["finish_reason"] is not None
    status, plain = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 0})
    assert status == 400 and plain["error"]["param"] == "max_tokens"  # without echo: as vLLM


def test_echo_of_token_ids_and_of_a_prompt_list(server: ServerThread) -> None:
    """Token-id prompts lead with their own first id; a list of prompts with n = 2 numbers
    choices prompt-major, each led by its prompt's rows."""
    ids = server.engine.tokenizer.encode("Ids are scored too", False)
    prompts: list[Any] = [ids, PROMPT]
    body = {"prompt": prompts, "max_tokens": 2, "n": 2, "logprobs": 1, "echo": True, "seed": 3}
    status, out = _post(server, "/v1/completions", body)
    assert status == 200
    choices = sorted(out["choices"], key=lambda c: c["index"])
    assert len(choices) == 4
    for choice in choices:
        prompt = prompts[choice["index"] // 2]
        _check_echo(server, choice["logprobs"], prompt, 1)
        echoed = server.engine.tokenizer.decode(prompt, False) if prompt is ids else prompt
        assert choice["text"].startswith(echoed)
        _check_offsets(choice["logprobs"], choice["text"])


def _check_prompt_logprobs(
    server: ServerThread, got: list[Any], scores: tuple[TokenLogprob, ...], k: int
) -> None:
    """vLLM's format: [null, {token id: {logprob, rank, decoded_token}}, ...], the prompt's
    token first (its rank: its place in the top k, else null), then the top k ranked 1..k."""
    assert got[0] is None and len(got) == len(scores) + 1
    for position, entry in zip(got[1:], scores, strict=True):
        ranked = [t for t, _ in entry.top]
        others = [t for t in ranked if t != entry.token_id]
        assert [int(key) for key in position] == [entry.token_id, *others]
        mine = position[str(entry.token_id)]
        expected_rank = ranked.index(entry.token_id) + 1 if entry.token_id in ranked else None
        assert mine == {
            "logprob": entry.logprob,
            "rank": expected_rank,
            "decoded_token": _text(server, entry.token_id),
        }
        for rank, (token_id, logprob) in enumerate(entry.top, 1):
            assert position[str(token_id)] == {
                "logprob": logprob,
                "rank": rank,
                "decoded_token": _text(server, token_id),
            }
        assert len(position) in ((k, k + 1) if k else (1,))


def test_prompt_logprobs_on_completions_and_chat(server: ServerThread) -> None:
    k = 2
    status, out = _post(
        server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": k}
    )
    assert status == 200
    choice = out["choices"][0]
    assert choice["logprobs"] is None  # only the prompt's were asked for
    _check_prompt_logprobs(server, choice["prompt_logprobs"], _engine_scores(server, PROMPT, k), k)
    assert len(choice["prompt_logprobs"]) == out["usage"]["prompt_tokens"]

    messages = [{"role": "user", "content": "Score this chat prompt"}]
    status, chat = _post(
        server,
        "/v1/chat/completions",
        {"messages": messages, "max_tokens": 2, "prompt_logprobs": 0},
    )
    assert status == 200
    scores = _engine_scores(server, messages, 0)
    _check_prompt_logprobs(server, chat["prompt_logprobs"], scores, 0)  # on the response
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    assert "prompt_logprobs" not in chat["choices"][0]


def test_a_prompt_token_outside_the_top_k_has_no_rank(server: ServerThread) -> None:
    """The fake model's top alternatives start at the prompt token's id modulo its vocabulary
    bound: a token id past it is not among them (k + 1 entries, its rank null)."""
    high = 30001  # the fake model's bound is 30000: its top-1 is id 1
    status, out = _post(
        server, "/v1/completions", {"prompt": [5, high, 7], "max_tokens": 1, "prompt_logprobs": 1}
    )
    assert status == 200
    entry = out["choices"][0]["prompt_logprobs"][1]
    assert list(entry) == [str(high), "1"]
    assert entry[str(high)]["rank"] is None and entry["1"]["rank"] == 1


def test_openai_client_reads_the_echo_and_the_refusals(
    client: OpenAI, server: ServerThread
) -> None:
    """The official client's view, and a 400 naming prompt_logprobs with its limit."""
    out = client.completions.create(
        model=server.engine.model_name,
        prompt=PROMPT,
        max_tokens=1,
        logprobs=1,
        echo=True,
        temperature=0,
    )
    logprobs = out.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs is not None
    assert all(lp is not None and lp <= 0 for lp in logprobs.token_logprobs[1:])
    for kwargs in ({}, {"stream": True}):
        status, body = _post(
            server, "/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 21, **kwargs}
        )
        assert status == 400 and body["error"]["param"] == "prompt_logprobs"
        assert "[0, 20]" in body["error"]["message"]
    messages = [{"role": "user", "content": "x"}]
    status, body = _post(
        server, "/v1/chat/completions", {"messages": messages, "prompt_logprobs": 21}
    )
    assert status == 400 and body["error"]["param"] == "prompt_logprobs"


def test_best_of_answers_keep_the_prompts_rows(server: ServerThread) -> None:
    """best_of > n ranks whole answers at the end; each still leads with the prompt's rows."""
    body = {"prompt": PROMPT, "max_tokens": 3, "n": 2, "best_of": 3, "logprobs": 1, "echo": True}
    status, out = _post(server, "/v1/completions", {**body, "seed": 5})
    assert status == 200
    assert sorted(c["index"] for c in out["choices"]) == [0, 1]
    for choice in out["choices"]:
        _check_echo(server, choice["logprobs"], PROMPT, 1)
        _check_offsets(choice["logprobs"], choice["text"])
