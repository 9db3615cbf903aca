"""return_tokens_as_token_ids (vLLM's request field and server flag) on completions and chat,
against the fake runner behind a real server: logprobs name each token "token_id:{id}" (tokens,
top_logprobs keys, chat's token and top tokens, an echoed prompt's rows, streamed or not), the
ids the engine sampled; everything else (logprob values, text_offset, chat's bytes, the
text, prompt_logprobs' decoded_token) stays what the same request answers without it.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

import pytest
from troupe.gateway.state import GatewaySettings
from troupe.messages import Delta, Finished, SamplingParams

from tests.gateway.conftest import ServerThread

PROMPT = "Name every token of this"
USER = [{"role": "user", "content": "Say something."}]
PLACEHOLDER = re.compile(r"token_id:(\d+)")
FLAG = "return_tokens_as_token_ids"


def _post(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST JSON; (status, JSON body, or a stream's chunks)."""
    request = urllib.request.Request(
        f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            if not body.get("stream"):
                return response.status, json.loads(text)
            frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f]
            assert frames[-1] == "[DONE]"
            return response.status, [json.loads(f) for f in frames[:-1]]
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _id(label: str) -> int:
    match = PLACEHOLDER.fullmatch(label)
    assert match is not None, label
    return int(match.group(1))


def _decoded(server: ServerThread, label: str) -> str:
    """The text of the token a placeholder names (generated tokens: special tokens skipped)."""
    return str(server.engine.tokenizer.decode([_id(label)], True))


def _engine_ids(server: ServerThread, body: dict[str, Any]) -> list[int]:
    """The tokens the engine samples for this completion request (the fake runner is a pure
    function of the prompt and the seed)."""

    async def run() -> list[int]:
        params = SamplingParams(max_tokens=body["max_tokens"], seed=body["seed"])
        ids: list[int] = []
        async for event in server.engine.generate(body["prompt"], params):
            if isinstance(event, Delta | Finished):
                ids.extend(event.token_ids)
        return ids

    ids: list[int] = server.call(run())
    return ids


COMPLETION = {"prompt": PROMPT, "max_tokens": 4, "logprobs": 2, "seed": 3}


def test_completion_logprobs_name_the_sampled_ids(server: ServerThread) -> None:
    _, plain = _post(server.url, "/v1/completions", {**COMPLETION, FLAG: False})
    status, named = _post(server.url, "/v1/completions", {**COMPLETION, FLAG: True})
    assert status == 200, named
    got, want = named["choices"][0]["logprobs"], plain["choices"][0]["logprobs"]
    ids = _engine_ids(server, COMPLETION)
    assert got["tokens"] == [f"token_id:{i}" for i in ids]
    assert [_decoded(server, t) for t in got["tokens"]] == want["tokens"]
    for top, plain_top in zip(got["top_logprobs"], want["top_logprobs"], strict=True):
        assert [_decoded(server, k) for k in top] == list(plain_top)
        assert list(top.values()) == list(plain_top.values())
    # the text and its offsets are the text's, not the placeholders'
    assert got["text_offset"] == want["text_offset"]
    assert got["token_logprobs"] == want["token_logprobs"]
    assert named["choices"][0]["text"] == plain["choices"][0]["text"]


def test_an_echoed_prompt_leads_by_id_streamed_or_not(server: ServerThread) -> None:
    body = {**COMPLETION, "echo": True, "logprobs": 1, FLAG: True}
    prompt_ids = server.engine.tokenizer.encode(PROMPT, True)
    ids = [*prompt_ids, *_engine_ids(server, COMPLETION)]
    status, whole = _post(server.url, "/v1/completions", body)
    assert status == 200, whole
    choice = whole["choices"][0]
    assert [_id(t) for t in choice["logprobs"]["tokens"]] == ids
    assert choice["logprobs"]["token_logprobs"][0] is None  # the prompt's first token
    # prompt_logprobs keep vLLM's decoded_token: the text
    first = choice["prompt_logprobs"][1][str(prompt_ids[1])]
    assert first["decoded_token"] == server.engine.tokenizer.decode([prompt_ids[1]], False)
    status, chunks = _post(server.url, "/v1/completions", {**body, "stream": True})
    assert status == 200
    streamed = [t for c in chunks if c["choices"] for t in c["choices"][0]["logprobs"]["tokens"]]
    assert [_id(t) for t in streamed] == ids


CHAT = {"messages": USER, "max_tokens": 4, "logprobs": True, "top_logprobs": 2, "seed": 5}


def test_chat_logprobs_name_tokens_by_id_and_keep_their_bytes(server: ServerThread) -> None:
    _, plain = _post(server.url, "/v1/chat/completions", CHAT)
    status, named = _post(server.url, "/v1/chat/completions", {**CHAT, FLAG: True})
    assert status == 200, named
    got, want = (
        named["choices"][0]["logprobs"]["content"],
        plain["choices"][0]["logprobs"]["content"],
    )
    assert len(got) == len(want) == 4
    for entry, plain_entry in zip(got, want, strict=True):
        assert _decoded(server, entry["token"]) == plain_entry["token"]
        assert entry["bytes"] == plain_entry["bytes"] == list(plain_entry["token"].encode())
        assert entry["logprob"] == plain_entry["logprob"]
        tops = [_decoded(server, t["token"]) for t in entry["top_logprobs"]]
        assert tops == [t["token"] for t in plain_entry["top_logprobs"]]
        assert [t["bytes"] for t in entry["top_logprobs"]] == [
            t["bytes"] for t in plain_entry["top_logprobs"]
        ]
    status, chunks = _post(server.url, "/v1/chat/completions", {**CHAT, FLAG: True, "stream": True})
    assert status == 200
    streamed = [
        e["token"]
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert streamed == [e["token"] for e in got]


def test_the_server_flag_is_the_default_a_request_overrides(server: ServerThread) -> None:
    url = server.add_gateway(GatewaySettings(return_tokens_as_token_ids=True))
    _, by_default = _post(url, "/v1/completions", COMPLETION)
    ids = _engine_ids(server, COMPLETION)
    assert by_default["choices"][0]["logprobs"]["tokens"] == [f"token_id:{i}" for i in ids]
    _, chat = _post(url, "/v1/chat/completions", CHAT)
    assert all(PLACEHOLDER.fullmatch(e["token"]) for e in chat["choices"][0]["logprobs"]["content"])
    _, declined = _post(url, "/v1/completions", {**COMPLETION, FLAG: False})
    _, plain = _post(server.url, "/v1/completions", COMPLETION)
    assert declined["choices"][0]["logprobs"] == plain["choices"][0]["logprobs"]
    assert not any(PLACEHOLDER.fullmatch(t) for t in plain["choices"][0]["logprobs"]["tokens"])


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)]
)
def test_a_bad_value_is_a_400_naming_the_field(
    server: ServerThread, path: str, body: dict[str, Any]
) -> None:
    status, answer = _post(server.url, path, {**body, FLAG: "yes"})
    assert status == 400
    assert answer["error"]["param"] == FLAG
    assert FLAG in answer["error"]["message"]
