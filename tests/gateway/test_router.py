"""The router in front of real fake-runner replicas: where requests go, streams, failures."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from aiohttp import web
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.router_harness import LoopThread, RouterThread

MODEL = ""  # '' means the served model (the replicas check the name)
SYSTEM = (
    "You are a careful assistant for a shipping company. Answer in one short sentence, "
    "cite the tariff table when a price is asked, never invent tracking numbers, and say "
    "so when a question is outside shipping. Customers are billed per kilogram and zone."
)


@pytest.fixture(scope="module")
def backends() -> Iterator[list[ServerThread]]:
    """Two replicas, engines in this process (a FaultyRunner each, to hold steps)."""
    started = []
    for _ in range(2):
        runner = FaultyRunner(FakeRunner.from_config(BASE_CONFIG))
        settings = GatewaySettings(engine_process=False)
        started.append(ServerThread(BASE_CONFIG, settings, runner=runner).start())
    yield started
    for srv in started:
        srv.runner.release()
        srv.shutdown()


@pytest.fixture
def make_router() -> Iterator[object]:
    routers: list[RouterThread] = []

    def make(urls: list[str], **kw: object) -> RouterThread:
        settings = RouterSettings(backend_urls=tuple(urls), health_check_interval_s=3600.0)
        router = RouterThread().start_router(settings.replace(**kw))
        routers.append(router)
        return router

    yield make
    for router in routers:
        router.close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _post(url: str, body: object) -> urllib.request.Request:
    data = json.dumps(body).encode()
    return urllib.request.Request(url, data, {"Content-Type": "application/json"})


def _post_text(url: str, body: object) -> str:
    with urllib.request.urlopen(_post(url, body), timeout=30) as resp:
        return str(resp.read().decode())


def _served(url: str) -> int:
    """Requests a replica has ended (its own /metrics)."""
    text = _get(f"{url}/metrics")[1]
    return int(
        sum(s.value for f in text_string_to_metric_families(text) if f.name == "troupe_requests"
            for s in f.samples if s.name == "troupe_requests_total")
    )  # fmt: skip


def _router_counts(router: RouterThread, metric: str) -> dict[str, float]:
    text = _get(f"{router.url}/metrics")[1]
    return {
        s.labels["replica"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == metric
    }


def _client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def _chat(client: OpenAI, question: str) -> str:
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=4,
        temperature=0,
    )
    return out.choices[0].message.content or ""


def test_shared_prefix_workload_stays_on_one_replica(backends, make_router) -> None:  # type: ignore[no-untyped-def]
    urls = [b.url for b in backends]
    router = make_router(urls)
    before = [_served(u) for u in urls]
    client = _client(router.url)
    questions = [f"How much is a {k} kg parcel to zone {k % 3}?" for k in range(8)]
    with ThreadPoolExecutor(8) as pool:  # concurrent: the load stays under the thresholds
        list(pool.map(lambda q: _chat(client, q), questions))
    served = [_served(u) - b for u, b in zip(urls, before, strict=True)]
    assert sorted(served) == [0, 8], served
    routed = _router_counts(router, "troupe_router_requests_total")
    hits = _router_counts(router, "troupe_router_prefix_hits_total")
    home = urls[served.index(8)]
    assert routed[home] == 8 and hits[home] == 7  # the first one had no prefix to follow
    assert sum(routed.values()) == 8 and sum(hits.values()) == 7


def test_unrelated_prompts_spread_and_families_stay_home(backends, make_router) -> None:  # type: ignore[no-untyped-def]
    urls = [b.url for b in backends]
    router = make_router(urls)
    client = _client(router.url)
    before = [_served(u) for u in urls]
    for k in range(8):  # one at a time: loads are all 0, the trees decide
        prompt = f"{k}{chr(65 + k) * 5} unrelated prompt number {k}, padded to one length."
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    served = [_served(u) - b for u, b in zip(urls, before, strict=True)]
    assert served == [4, 4]
    assert sum(_router_counts(router, "troupe_router_prefix_hits_total").values()) == 0

    # Two conversations with different system prompts, interleaved: each keeps its replica.
    router2 = make_router(urls)
    client2 = _client(router2.url)
    for k in range(3):
        for system in ("Alpha " * 30, "Omega " * 30):
            client2.chat.completions.create(
                model=MODEL, max_tokens=2,
                messages=[{"role": "system", "content": system},
                          {"role": "user", "content": f"question {k}"}],
            )  # fmt: skip
    stats = router2.stats()
    assert [s["routed"] for s in stats] == [3, 3] and [s["hits"] for s in stats] == [2, 2]


def test_streaming_passes_through_token_by_token(backends, make_router) -> None:  # type: ignore[no-untyped-def]
    router = make_router([backends[0].url])
    runner = backends[0].runner
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12,
            "temperature": 0, "stream": True, "ignore_eos": True}  # fmt: skip
    direct = _sse_texts(_post_text(f"{backends[0].url}/v1/completions", body))
    runner.hold_after(4)  # prefill and 3 decodes, then the replica's engine waits
    try:
        req = _post(f"{router.url}/v1/completions", body)
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
            early = []
            while len(early) < 3:  # these arrive while the replica is held mid-request
                line = resp.readline().decode()
                if line.startswith("data: {"):
                    early.append(json.loads(line[6:])["choices"][0]["text"])
            assert runner.wait_until_held(30) and runner.is_waiting
            runner.release()
            rest = _sse_texts(resp.read().decode())
    finally:
        runner.release()
    assert "".join(early + rest) == "".join(direct)


def _sse_texts(text: str) -> list[str]:
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    return [json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"]]


def test_openai_client_through_the_router(backends, make_router) -> None:  # type: ignore[no-untyped-def]
    router = make_router([b.url for b in backends])
    via, direct = _client(router.url), _client(backends[0].url)
    assert [m.id for m in via.models.list().data] == [backends[0].engine.model_name]
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    kw = {"model": MODEL, "max_tokens": 6, "temperature": 0}
    whole = via.chat.completions.create(messages=messages, **kw)  # type: ignore[arg-type]
    expected = direct.chat.completions.create(messages=messages, **kw)  # type: ignore[arg-type]
    assert whole.choices[0].message.content == expected.choices[0].message.content
    chunks = list(via.chat.completions.create(messages=messages, stream=True, **kw))  # type: ignore[arg-type]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == expected.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == expected.choices[0].finish_reason
    with pytest.raises(openai.BadRequestError, match="max_tokens"):  # the replica's 400, as sent
        via.completions.create(model=MODEL, prompt="x", max_tokens=-1)


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_replica_going_away(backends, make_router) -> None:  # type: ignore[no-untyped-def]
    doomed = ServerThread(BASE_CONFIG, GatewaySettings(engine_process=False),
                          runner=FakeRunner.from_config(BASE_CONFIG)).start()  # fmt: skip
    router = make_router([backends[0].url, doomed.url])
    client = _client(router.url)
    doomed.shutdown()  # the router has not noticed: its next request there is refused
    for k in range(4):
        out = client.completions.create(model=MODEL, prompt=f"{k}" * 40,
                                        max_tokens=2)  # fmt: skip
        assert out.choices[0].finish_reason in ("length", "stop")
    live, gone = router.stats()
    assert gone["up"] is False and gone["failures"] == 1 and gone["in_flight"] == 0
    assert live["up"] is True and live["routed"] == 4 and gone["routed"] == 1

    nobody = make_router([_dead_url(), _dead_url()])
    assert _get(f"{nobody.url}/health")[0] == 503
    with pytest.raises(openai.InternalServerError) as info:
        _client(nobody.url).completions.create(model="m", prompt="hi", max_tokens=2)
    assert info.value.status_code == 503 and "no replica is up" in str(info.value)


@pytest.mark.parametrize("how", ["reset", "eof"])
def test_a_replica_dying_mid_stream_gives_one_error_event(make_router, how: str) -> None:  # type: ignore[no-untyped-def]
    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("Hel", "lo"):
            chunk = {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
            }
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())  # fmt: skip
        if how == "reset":
            assert request.transport is not None
            request.transport.abort()  # the replica dies: no chunk terminator, no [DONE]
        else:
            await resp.write_eof()  # a clean close, but the stream never ended
        return resp

    stand_in = LoopThread()
    try:
        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_post("/v1/chat/completions", chat)
        router = make_router([stand_in.add_app(app)])
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        text = _post_text(f"{router.url}/v1/chat/completions", body)
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
        payloads = [json.loads(e) for e in events[:-1]]
        assert [p["choices"][0]["delta"]["content"] for p in payloads[:2]] == ["Hel", "lo"]
        assert len(payloads) == 3 and payloads[2]["error"]["code"] == "replica_failed"
        assert router.stats()[0]["failures"] == 1 and router.stats()[0]["up"] is False
        fresh = make_router([router.stats()[0]["url"]])  # the replica is up again there
        with pytest.raises(openai.APIError, match=r"mid-stream|before its end"):
            list(_client(fresh.url).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True))  # fmt: skip
    finally:
        stand_in.close()


def _outcome(url: str, outcome: str) -> float:
    text = _get(f"{url}/metrics")[1]
    return sum(
        s.value for f in text_string_to_metric_families(text) for s in f.samples
        if s.name == "troupe_requests_total" and s.labels.get("outcome") == outcome
    )  # fmt: skip


def test_a_client_leaving_aborts_the_request_on_its_replica(backends, make_router) -> None:  # type: ignore[no-untyped-def]
    srv = backends[1]
    router = make_router([srv.url])
    aborted = _outcome(srv.url, "aborted")
    body = {"prompt": "A long story", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    srv.runner.hold_after(3)  # the request cannot run to its end before the client leaves
    try:
        with urllib.request.urlopen(_post(f"{router.url}/v1/completions", body), timeout=30) as r:
            assert r.readline().startswith(b"data: {")  # streaming; then the client hangs up
    finally:
        srv.runner.release()
    srv.wait_idle(60)
    assert _outcome(srv.url, "aborted") == aborted + 1  # not run to its 4000 tokens
    assert router.stats()[0]["in_flight"] == 0 and router.stats()[0]["failures"] == 0


def test_a_replica_that_recovers_gets_traffic_again(make_router) -> None:  # type: ignore[no-untyped-def]
    state = {"healthy": True}

    async def health(request: web.Request) -> web.Response:
        return web.json_response({}, status=200 if state["healthy"] else 503)

    async def completions(request: web.Request) -> web.Response:
        if not state["healthy"]:
            return web.json_response({"error": {"message": "draining"}}, status=503)
        return web.json_response({"choices": [{"text": "ok"}]})

    stand_in = LoopThread()
    try:
        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_post("/v1/completions", completions)
        router = make_router([stand_in.add_app(app)], health_check_interval_s=0.05)
        state["healthy"] = False
        req = _post(f"{router.url}/v1/completions", {"prompt": "hi"})
        with pytest.raises(urllib.error.HTTPError) as info:  # its 503: down, nobody else
            urllib.request.urlopen(req, timeout=30)
        assert info.value.code == 503 and "no replica is up" in info.value.read().decode()
        assert router.stats()[0]["up"] is False
        state["healthy"] = True
        deadline = time.monotonic() + 30
        while not router.stats()[0]["up"]:  # the health loop's next round brings it back
            assert time.monotonic() < deadline, "the replica never came back"
            time.sleep(0.02)
        assert json.loads(_post_text(f"{router.url}/v1/completions", {"prompt": "hi"})) == {
            "choices": [{"text": "ok"}]
        }
    finally:
        stand_in.close()


def test_a_503_from_a_healthy_replica_goes_elsewhere_and_keeps_it_up(make_router) -> None:  # type: ignore[no-untyped-def]
    def replica(status: int, text: str) -> web.Application:
        async def health(request: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        async def completions(request: web.Request) -> web.Response:
            return web.json_response({"choices": [{"text": text}]}, status=status)

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_post("/v1/completions", completions)
        return app

    stand_in = LoopThread()
    try:
        capped = stand_in.add_app(replica(503, "at its connection cap"))
        router = make_router([capped, stand_in.add_app(replica(200, "served"))])
        out = json.loads(_post_text(f"{router.url}/v1/completions", {"prompt": "hi"}))
        assert out == {"choices": [{"text": "served"}]}
        first, second = router.stats()
        assert first["routed"] == 1 and first["failures"] == 1 and first["up"] is True
        assert second["routed"] == 1 and second["failures"] == 0
    finally:
        stand_in.close()


def test_router_stats_need_the_key_when_one_is_set(make_router) -> None:  # type: ignore[no-untyped-def]
    router = make_router([_dead_url()], api_key="sesame")
    assert _get(f"{router.url}/v1/router/stats")[0] == 401
    req = urllib.request.Request(
        f"{router.url}/v1/router/stats", headers={"Authorization": "Bearer sesame"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert json.loads(resp.read())["replicas"][0]["is_up"] is False


def test_sagemaker_and_sglang_paths_through_the_router(backends, make_router) -> None:  # type: ignore[no-untyped-def]
    """/invocations is proxied (keyed as the endpoint it names: a chat there follows the same
    conversation's replica); /ping answers as /health; /version is troupe's; SGLang's
    /generate passes whole and streamed."""
    urls = [b.url for b in backends]
    router = make_router(urls)
    before = [_served(u) for u in urls]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Zone 2?"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 2, "temperature": 0}
    chat = json.loads(_post_text(f"{router.url}/v1/chat/completions", body))
    via = json.loads(_post_text(f"{router.url}/invocations", body))
    assert via["object"] == "chat.completion"
    assert via["choices"] == chat["choices"]
    served = [_served(u) - b for u, b in zip(urls, before, strict=True)]
    assert sorted(served) == [0, 2], served  # the second followed the first's prefix
    assert _get(f"{router.url}/ping") == _get(f"{router.url}/health")
    with urllib.request.urlopen(_post(f"{router.url}/ping", {}), timeout=30) as resp:
        assert resp.status == 200
    assert json.loads(_get(f"{router.url}/version")[1])["version"]
    # SGLang's /generate is proxied whole and streamed (its stream ends with [DONE])
    body = {"text": SYSTEM, "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
    direct = json.loads(_post_text(f"{backends[0].url}/generate", body))
    via = json.loads(_post_text(f"{router.url}/generate", body))
    assert via["output_ids"] == direct["output_ids"] and via["text"] == direct["text"]
    streamed = _post_text(f"{router.url}/generate", {**body, "stream": True})
    frames = [f[6:] for f in streamed.split("\n\n") if f.startswith("data: ")]
    assert frames[-1] == "[DONE]" and json.loads(frames[-2])["text"] == direct["text"]
