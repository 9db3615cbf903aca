"""POST /v1/embeddings on the fake runner (its made-up 8-float vectors), through the official
`openai` client and raw HTTP: the answer's shape, float and base64 encodings, inputs in order
as the engine pools each alone, usage, vLLM's `normalize`, the errors (dimensions, empty input,
bad encoding_format, a refused input naming `input[i]` and leaving nothing running), the API
key, the request counts in /metrics, the `--pooling-type` setting, and the router."""

from __future__ import annotations

import argparse
import base64
import json
import struct
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families
from troupe.config import ConfigError
from troupe.gateway.router_app import PROXIED
from troupe.gateway.router_keys import routing_key
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.server import add_serve_arguments
from troupe.gateway.settings import GatewaySettings, settings_from_args
from troupe.messages import Pooling, SamplingParams

from tests.gateway.router_harness import RouterThread

INPUTS = ["Once upon a time", "The weather today is", "A"]


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def _pooled(server, prompt: Any, pooling: Pooling | None = None) -> tuple[list[float], int]:  # type: ignore[no-untyped-def]
    """The engine's own vector for `prompt` run alone, and its prompt tokens."""

    async def run() -> tuple[list[float], int]:
        params = SamplingParams(max_tokens=1, temperature=0.0, pooling=pooling or Pooling())
        events = [e async for e in server.engine.generate(prompt, params)]
        assert events[0].embedding is not None, events
        return list(events[0].embedding), events[-1].usage.prompt_tokens

    return server.call(run())  # type: ignore[no-any-return]


def _post(url: str, body: object, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(f"{url}/v1/embeddings", data, headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _floats(b64: str) -> list[float]:
    raw = base64.b64decode(b64)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))  # little-endian float32


def _f32(vector: list[float]) -> list[float]:
    """`vector` rounded to float32, as base64 carries it (the fake runner makes up doubles)."""
    return list(struct.unpack(f"<{len(vector)}f", struct.pack(f"<{len(vector)}f", *vector)))


def test_answer_shape_and_order(server) -> None:  # type: ignore[no-untyped-def]
    status, body = _post(server.url, {"model": server.engine.model_name, "input": INPUTS})
    assert status == 200, body
    assert body["object"] == "list" and body["id"].startswith("embd-")
    assert body["model"] == server.engine.model_name and isinstance(body["created"], int)
    assert [d["object"] for d in body["data"]] == ["embedding"] * 3
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    alone = [_pooled(server, p) for p in INPUTS]
    assert [d["embedding"] for d in body["data"]] == [v for v, _ in alone]
    assert len({tuple(v) for v, _ in alone}) == 3  # distinct: the order is checked
    num_tokens = sum(n for _, n in alone)
    assert body["usage"] == {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
    for vector, _ in alone:
        assert len(vector) == 8 and sum(v * v for v in vector) == pytest.approx(1.0)


def test_openai_client_float_and_base64(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    model = server.engine.model_name
    alone = [_pooled(server, p)[0] for p in INPUTS]
    as_float = client.embeddings.create(model=model, input=INPUTS, encoding_format="float")
    assert [d.embedding for d in as_float.data] == alone
    # the client's default: it asks for base64 and decodes it as float32 itself
    default = client.embeddings.create(model=model, input=INPUTS)
    assert [d.embedding for d in default.data] == [_f32(v) for v in alone]
    as_b64 = client.embeddings.create(model=model, input=INPUTS, encoding_format="base64")
    decoded = [_floats(d.embedding) for d in as_b64.data]  # type: ignore[arg-type]
    assert decoded == [_f32(v) for v in alone]
    assert as_b64.usage.prompt_tokens == as_float.usage.prompt_tokens > 0
    one = client.embeddings.create(model=model, input=INPUTS[1], encoding_format="float")
    assert [d.embedding for d in one.data] == [alone[1]]


def test_token_id_inputs(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    model = server.engine.model_name
    ids = [[int(t) for t in server.engine.tokenizer.encode(p)] for p in INPUTS[:2]]
    out = client.embeddings.create(model=model, input=ids, encoding_format="float")
    assert [d.embedding for d in out.data] == [_pooled(server, i)[0] for i in ids]
    assert out.usage.prompt_tokens == len(ids[0]) + len(ids[1])
    one = client.embeddings.create(model=model, input=ids[1], encoding_format="float")
    assert one.data[0].embedding == out.data[1].embedding and one.usage.prompt_tokens == len(ids[1])


@pytest.mark.parametrize("field", ["normalize", "use_activation"])
def test_not_normalized(server, field: str) -> None:  # type: ignore[no-untyped-def]
    status, body = _post(server.url, {"input": INPUTS[0], field: False})
    assert status == 200, body
    raw = _pooled(server, INPUTS[0], Pooling(normalize=False))[0]
    assert body["data"][0]["embedding"] == raw
    assert sum(v * v for v in raw) != pytest.approx(1.0)
    status, body = _post(server.url, {"input": "a", "normalize": True, "use_activation": False})
    assert status == 400 and body["error"]["param"] == "use_activation", body


def test_dimensions_is_refused_by_name(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=server.engine.model_name, input="hi", dimensions=8)
    assert info.value.body["param"] == "dimensions", info.value.body  # type: ignore[index]
    assert "matryoshka" in info.value.body["message"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("given", "param"),
    [
        ("", "input"),
        ([], "input"),
        (["a", ""], "input[1]"),
        ([[1, 2], []], "input[1]"),
        (["a", 5], "input"),
        ({"text": "a"}, "input"),
    ],
)
def test_bad_input_is_400(server, given: Any, param: str) -> None:  # type: ignore[no-untyped-def]
    status, body = _post(server.url, {"input": given})
    assert status == 400 and body["error"]["param"] == param, body


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"encoding_format": "binary"}, "encoding_format"),
        ({"truncate_prompt_tokens": 4}, "truncate_prompt_tokens"),  # not served: unknown
        ({"priority": 2**40}, "priority"),
        ({"user": 5}, "user"),
    ],
)
def test_bad_fields_are_400(server, extra: dict[str, Any], param: str) -> None:  # type: ignore[no-untyped-def]
    status, body = _post(server.url, {"input": "a", **extra})
    assert status == 400 and body["error"]["param"] == param, body


def test_unknown_model_is_404(server) -> None:  # type: ignore[no-untyped-def]
    status, body = _post(server.url, {"input": "a", "model": "nope"})
    assert status == 404 and body["error"]["param"] == "model", body


def test_a_refused_input_fails_the_request_by_name(server) -> None:  # type: ignore[no-untyped-def]
    too_long = [7] * (server.engine.max_model_len + 1)
    status, body = _post(server.url, {"input": [[5, 6, 7], too_long, [8, 9]]})
    assert status == 400, body
    assert body["error"]["param"] == "input[1]" and "input[1]" in body["error"]["message"]
    assert body["error"]["code"] == "context_length_exceeded"
    status, body = _post(server.url, {"input": ["a", [5, 10**9]]})  # outside the vocabulary
    assert status == 400 and body["error"]["param"] == "input[1]", body
    status, body = _post(server.url, {"input": [[5, 10**9]]})  # a list of one: still indexed
    assert status == 400 and body["error"]["param"] == "input[0]", body
    status, body = _post(server.url, {"input": [5, 10**9]})  # one input's token ids
    assert status == 400 and body["error"]["param"] == "input", body
    server.wait_idle(20.0)  # the other inputs' requests were aborted: nothing left running


def test_inputs_per_request_are_bounded(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(max_embedding_inputs=2))
    assert _post(url, {"input": ["a", "b"]})[0] == 200
    status, body = _post(url, {"input": ["a", "b", "c"]})
    assert status == 400 and body["error"]["param"] == "input", body
    assert "at most 2 inputs" in body["error"]["message"]


def test_api_key_applies(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(api_key="sesame"))
    status, body = _post(url, {"input": "a"})
    assert status == 401 and body["error"]["code"] == "missing_api_key", body
    assert _post(url, {"input": "a"}, {"Authorization": "Bearer wrong"})[0] == 401
    assert _post(url, {"input": "a"}, {"Authorization": "Bearer sesame"})[0] == 200


def _ended(url: str, outcome: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "troupe_requests_total" and s.labels["outcome"] == outcome
    )


def test_metrics_count_each_input(server) -> None:  # type: ignore[no-untyped-def]
    before = _ended(server.url, "length")  # one generated token: each ends by length
    assert _post(server.url, {"input": INPUTS})[0] == 200
    assert _ended(server.url, "length") == before + len(INPUTS)


def test_pooling_type_setting() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert settings_from_args(parser.parse_args([])).pooling_type == "last"
    assert settings_from_args(parser.parse_args(["--pooling-type", "mean"])).pooling_type == "mean"
    with pytest.raises(SystemExit):
        parser.parse_args(["--pooling-type", "max"])
    with pytest.raises(ConfigError, match="pooling_type"):
        GatewaySettings(pooling_type="max")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_embedding_inputs"):
        GatewaySettings(max_embedding_inputs=0)


def test_routing_key_reads_input() -> None:
    text, prompt = PROXIED["/v1/embeddings"].text, PROXIED["/v1/completions"].text
    assert routing_key({"input": "shared prefix"}, text) == "shared prefix"
    assert routing_key({"input": ["shared prefix"]}, text) == "shared prefix"
    assert routing_key({"input": [5, 6]}, text) == routing_key({"prompt": [5, 6]}, prompt)


def test_through_the_router(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    settings = RouterSettings(backend_urls=(server.url,), health_check_interval_s=3600.0)
    router = RouterThread().start_router(settings)
    try:
        via = OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0, timeout=30)
        model = server.engine.model_name
        got = via.embeddings.create(model=model, input=INPUTS, encoding_format="float")
        direct = client.embeddings.create(model=model, input=INPUTS, encoding_format="float")
        assert [d.embedding for d in got.data] == [d.embedding for d in direct.data]
        with pytest.raises(openai.BadRequestError, match="matryoshka"):  # the replica's 400
            via.embeddings.create(model=model, input="a", dimensions=4)
    finally:
        router.close()
