"""SGLang's native POST /generate over HTTP (fake-runner engine, SmolLM2's tokenizer): the
answer is the one /v1/completions gives the same request, in SGLang's shape (text, output_ids,
meta_info with finish_reason, counts and logprob rows), whole, batched and streamed; bad input
is a 400 naming SGLang's field."""

from __future__ import annotations

import itertools
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import scripted_server
from tests.gateway.scripted_runner import say, template_model

GREEDY = {"temperature": 0, "max_new_tokens": 6}
PROMPT = "The capital of France is"


def _post(url: str, path: str, body: Any, headers: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        f"{url}{path}", data, {"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            raw = resp.read().decode()
            if resp.headers["Content-Type"].startswith("text/event-stream"):
                frames = [f[6:] for f in raw.split("\n\n") if f.startswith("data: ")]
                assert frames[-1] == "[DONE]", frames[-1]
                return resp.status, [json.loads(f) for f in frames[:-1]]
            return resp.status, json.loads(raw)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _completion(url: str, prompt: Any, **extra: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    status, answer = _post(url, "/v1/completions", {**body, **extra})
    assert status == 200, answer
    choice: dict[str, Any] = answer["choices"][0]
    return choice


def test_the_answer_is_completions_in_sglangs_shape(server) -> None:  # type: ignore[no-untyped-def]
    want = _completion(server.url, PROMPT)
    status, out = _post(server.url, "/generate", {"text": PROMPT, "sampling_params": GREEDY})
    assert status == 200, out
    assert out["text"] == want["text"] and out["output_ids"] == want["token_ids"]
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == len(want["prompt_token_ids"]) and meta["completion_tokens"] == 6
    assert (
        len(meta["id"]) == 32 and meta["e2e_latency"] >= 0 and "output_token_logprobs" not in meta
    )
    status, by_ids = _post(
        server.url,
        "/generate",
        {"input_ids": want["prompt_token_ids"], "sampling_params": GREEDY, "rid": "r-1"},
    )
    assert status == 200 and by_ids["output_ids"] == out["output_ids"]
    assert by_ids["meta_info"]["id"] == "r-1"


def test_stops_name_what_matched(server) -> None:  # type: ignore[no-untyped-def]
    ids = _completion(server.url, PROMPT)["token_ids"]
    body = {"text": PROMPT, "sampling_params": {**GREEDY, "stop_token_ids": [ids[2]]}}
    status, out = _post(server.url, "/generate", body)
    assert status == 200 and out["meta_info"]["finish_reason"] == {
        "type": "stop",
        "matched": ids[2],
    }
    assert out["output_ids"] == ids[:3]
    word = _completion(server.url, PROMPT, max_tokens=3)["text"][-3:]
    sampling = {**GREEDY, "stop": [word]}
    for trim, shown in ((False, ""), (True, word)):
        body = {"text": PROMPT, "sampling_params": {**sampling, "no_stop_trim": trim}}
        status, out = _post(server.url, "/generate", body)
        assert status == 200 and out["meta_info"]["finish_reason"]["matched"] == word
        assert out["text"].endswith(shown) and (trim or word not in out["text"])


def test_logprob_rows(server) -> None:  # type: ignore[no-untyped-def]
    want = _completion(server.url, PROMPT, logprobs=2)
    body = {
        "text": PROMPT,
        "sampling_params": GREEDY,
        "return_logprob": True,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
        "logprob_start_len": 1,
    }
    status, out = _post(server.url, "/generate", body)
    assert status == 200, out
    meta = out["meta_info"]
    rows = meta["output_token_logprobs"]
    assert [r[1] for r in rows] == out["output_ids"]
    assert [r[0] for r in rows] == want["logprobs"]["token_logprobs"]
    assert "".join(r[2] for r in rows) == out["text"]
    assert [len(top) for top in meta["output_top_logprobs"]] == [2] * 6
    prompt_ids = want["prompt_token_ids"]
    assert [r[1] for r in meta["input_token_logprobs"]] == prompt_ids[1:]
    assert all(r[0] <= 0 for r in meta["input_token_logprobs"])
    assert len(meta["input_top_logprobs"]) == len(prompt_ids) - 1
    # from the first prompt token, whose logprob is null; max_new_tokens 0 shows no output
    body = {**body, "logprob_start_len": 0, "sampling_params": {"max_new_tokens": 0}}
    status, out = _post(server.url, "/generate", body)
    assert status == 200 and (out["text"], out["output_ids"]) == ("", [])
    meta = out["meta_info"]
    assert meta["input_token_logprobs"][0][:2] == [None, prompt_ids[0]]
    assert meta["input_top_logprobs"][0] is None and meta["output_token_logprobs"] == []
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    assert meta["completion_tokens"] == 0


def test_a_batch_with_n_is_prompt_major(server) -> None:  # type: ignore[no-untyped-def]
    prompts = [PROMPT, "Once upon a time"]
    body = {
        "text": prompts,
        "rid": ["a", "b"],
        "sampling_params": [{**GREEDY, "n": 2}, {**GREEDY, "n": 2, "max_new_tokens": 3}],
    }
    status, out = _post(server.url, "/generate", body)
    assert status == 200, out
    assert [o["meta_info"]["id"] for o in out] == ["a-0", "a-1", "b-0", "b-1"]
    status, named = _post(server.url, "/generate", {**body, "rid": "job"})  # SGLang's prefix
    assert [o["meta_info"]["id"] for o in named] == ["job_0-0", "job_0-1", "job_1-0", "job_1-1"]
    assert [o["meta_info"]["completion_tokens"] for o in out] == [6, 6, 3, 3]
    assert out[0]["text"] == _completion(server.url, prompts[0])["text"]
    status, chunks = _post(server.url, "/generate", {**body, "stream": True})
    assert status == 200
    last = {c["index"]: c for c in chunks}  # each sample's text and ids so far, in its chunks
    assert [last[i]["text"] for i in range(4)] == [o["text"] for o in out]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks if c is not last[c["index"]])


def test_a_stream_carries_the_text_so_far(server) -> None:  # type: ignore[no-untyped-def]
    status, whole = _post(server.url, "/generate", {"text": PROMPT, "sampling_params": GREEDY})
    body = {"text": PROMPT, "sampling_params": GREEDY, "stream": True, "return_logprob": True}
    status, chunks = _post(server.url, "/generate", body)
    assert status == 200 and "index" not in chunks[0]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert texts[-1] == whole["text"] and chunks[-1]["output_ids"] == whole["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert len(chunks[-1]["meta_info"]["output_token_logprobs"]) == 6


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"text": PROMPT, "input_ids": [1]}, "text"),
        ({}, "text"),
        ({"input_ids": [1, [2]]}, "input_ids"),
        ({"text": PROMPT, "sampling_params": {"stop_regex": "x"}}, "sampling_params.stop_regex"),
        ({"text": PROMPT, "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
        ({"text": PROMPT, "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
        ({"text": PROMPT, "sampling_params": {"max_new_tokens": 10**6}}, "sampling_params.max_new_tokens"),
        ({"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 10**6}}, "sampling_params.max_new_tokens"),
        ({"text": [PROMPT, "x"], "sampling_params": [{"n": 1}, {"n": 2}]}, "sampling_params.n"),
        ({"text": [PROMPT, "x"], "sampling_params": [{}]}, "sampling_params"),
        ({"text": [PROMPT, "x"], "rid": ["one"]}, "rid"),
        ({"text": PROMPT, "rid": ""}, "rid"),
        ({"text": PROMPT, "top_logprobs_num": 2}, "top_logprobs_num"),
        ({"text": PROMPT, "return_logprob": True, "top_logprobs_num": 99}, "top_logprobs_num"),
        ({"text": PROMPT, "lora_path": "nope"}, "lora_path"),
        ({"text": PROMPT * 5000}, "text"),
        ({"text": [PROMPT, PROMPT * 5000]}, "text[1]"),
        ({"text": PROMPT, "sampling_params": {"json_schema": "{", "regex": "a"}}, "sampling_params.regex"),
    ],
)  # fmt: skip
def test_bad_input_names_sglangs_field(server, body: Any, param: str) -> None:  # type: ignore[no-untyped-def]
    status, error = _post(server.url, "/generate", body)
    assert status == 400 and error["error"]["param"] == param, error
    if param.startswith("sampling_params.max"):
        assert "max_new_tokens" in error["error"]["message"]


def test_behind_the_key(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(api_key="sesame"))
    body = {"text": PROMPT, "sampling_params": GREEDY}
    assert _post(url, "/generate", body)[0] == 401
    assert _post(url, "/generate", body, {"Authorization": "Bearer sesame"})[0] == 200


def test_incremental_streaming_output(server) -> None:  # type: ignore[no-untyped-def]
    """SGLang's --incremental-streaming-output: each chunk carries only its own output; joined
    they are the whole answer."""
    url = server.add_gateway(GatewaySettings(incremental_streaming_output=True))
    status, whole = _post(url, "/generate", {"text": PROMPT, "sampling_params": GREEDY})
    body = {"text": PROMPT, "sampling_params": GREEDY, "stream": True, "return_logprob": True}
    status, chunks = _post(url, "/generate", body)
    assert status == 200 and len(chunks) > 1
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert [i for c in chunks for i in c["output_ids"]] == whole["output_ids"]
    rows = [r for c in chunks for r in c["meta_info"]["output_token_logprobs"]]
    assert [r[1] for r in rows] == whole["output_ids"]
    assert chunks[-1]["meta_info"]["completion_tokens"] == 6


def test_the_models_eos_is_the_match(tmp_path: Path) -> None:
    """At the model's EOS, SGLang names the EOS token as what matched (output_ids end with it;
    the text does not show it)."""
    folder = template_model(tmp_path, "{{ messages[0]['content'] }}")
    server = scripted_server(folder, GatewaySettings()).start()
    try:
        say(server, "Done here.")
        status, out = _post(server.url, "/generate", {"text": PROMPT})
        eos = server.engine.tokenizer.eos_token_ids[0]
        assert status == 200 and out["text"] == "Done here."
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}
        assert out["output_ids"][-1] == eos
    finally:
        server.shutdown()
