"""GET /v1/engine/stats: the live view's snapshot, read from what the engine measures."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from troupe.actors.wiring import TOKENIZER_BUFFER
from troupe.gateway.state import GatewaySettings
from websockets.sync.client import connect

pytestmark = pytest.mark.anyio

ACTORS = {"tokenizer", "admission", "scheduler", "allocator", "grammar", "executor", "streamer"}


async def _stats(http: aiohttp.ClientSession, url: str, **kw: Any) -> dict[str, Any]:
    async with http.get(f"{url}/v1/engine/stats", **kw) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Cache-Control"] == "no-store"
        return await resp.json()  # type: ignore[no-any-return]


def _actor(snapshot: dict[str, Any], name: str) -> dict[str, Any]:
    return next(a for a in snapshot["graph"]["actors"] if a["name"] == name)


def _sent(snapshot: dict[str, Any], sender: str, receiver: str) -> int:
    """What `sender` has sent to `receiver` (0 where it has no such outbox)."""
    sent = _actor(snapshot, sender)["sent"]
    return sum(int(c["num_messages"]) for c in sent if c["receiver"] == receiver)


async def test_counts_follow_a_request(server) -> None:  # type: ignore[no-untyped-def]
    """The engine runs in a child process here: the counts come over its socket."""
    async with aiohttp.ClientSession() as http:
        server.wait_idle()
        before = await _stats(http, server.url)
        body = {"prompt": "count my messages", "max_tokens": 6, "ignore_eos": True}
        async with http.post(f"{server.url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            assert (await resp.json())["usage"]["completion_tokens"] == 6
        server.wait_idle()
        after = await _stats(http, server.url)
    assert {a["name"] for a in after["graph"]["actors"]} == ACTORS
    assert after["model"] == server.engine.model_name
    assert after["max_model_len"] == server.engine.max_model_len
    assert after["graph"]["time"] > before["graph"]["time"]
    tokenizer = _actor(after, "tokenizer")
    assert tokenizer["num_received"] == _actor(before, "tokenizer")["num_received"] + 1
    assert (tokenizer["inbox_buffer"], _actor(after, "scheduler")["inbox_buffer"]) == (
        TOKENIZER_BUFFER,
        None,
    )
    # Six tokens: at least six plans and six results; the executor answers each plan once.
    plans = _sent(after, "scheduler", "executor") - _sent(before, "scheduler", "executor")
    assert plans >= 6
    assert _sent(after, "executor", "scheduler") - _sent(before, "executor", "scheduler") == plans
    # Every message the executor took came from an actor: the scheduler's plans and, after a
    # structured request on this shared server, grammar's masks.
    into_executor = sum(_sent(after, a["name"], "executor") for a in after["graph"]["actors"])
    assert _actor(after, "executor")["num_received"] == into_executor
    for actor in after["graph"]["actors"]:
        assert actor["num_received"] >= actor["num_batches"]
        assert actor["inbox_depth"] == 0 and actor["num_blocked_senders"] == 0  # idle
    engine = after["engine"]
    assert (engine["num_running"], engine["num_waiting"], engine["num_gpu_blocks_used"]) == (
        0,
        0,
        0,
    )
    assert engine["num_gpu_blocks"] == server.config.num_kv_blocks
    latency = after["latency"]
    assert latency["ttft"]["count"] >= 1 and latency["itl"]["count"] >= 5
    assert 0 < latency["ttft"]["p50"] <= latency["ttft"]["p90"] <= latency["ttft"]["p99"]
    assert latency["window_s"] > 0


async def test_stats_take_the_api_key(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(api_key="s3cret"))
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v1/engine/stats") as resp:
            assert resp.status == 401
        snapshot = await _stats(http, url, headers={"Authorization": "Bearer s3cret"})
        assert {a["name"] for a in snapshot["graph"]["actors"]} == ACTORS


async def test_page_and_static_files(server) -> None:  # type: ignore[no-untyped-def]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{server.url}/") as resp:
            assert resp.status == 200
            csp = resp.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "'unsafe-inline'" not in csp
            page = await resp.text()
        assert server.engine.model_name in page
        assert "<script>" not in page  # no inline script: the CSP would block it anyway
        for name in ("app.css", "main.js", "api.js", "chat.js", "markdown.js", "engine_view.js"):
            async with http.get(f"{server.url}/static/{name}") as resp:
                assert resp.status == 200, name
        async with http.get(f"{server.url}/static/../app.py") as resp:
            assert resp.status in (403, 404)


STATS = "fetch('/v1/engine/stats').then(r => r.json())"


def _figure(name: str) -> str:
    return f"document.getElementById('ev-{name}').textContent"


def test_live_view_follows_requests(browser, page_server, artifacts) -> None:  # type: ignore[no-untyped-def]
    """Three requests pinned mid-stream (FaultyRunner.hold_after): the view counts them, its
    arrows show traffic; released, everything returns to zero."""
    runner = page_server.runner
    page = browser.open(f"{page_server.url}/")
    try:
        page.click("#tab-engine")
        page.wait_for("Number(document.getElementById('engine-view').dataset.polls) >= 1")
        assert (page.text("#ev-running"), page.text("#ev-gpu-used")) == ("0", "0")
        admitted = (
            "s.graph.actors.find(a => a.name === 'admission').sent"
            ".find(c => c.receiver === 'scheduler').num_messages"
        )
        num_admitted = page.eval(f"{STATS}.then(s => {admitted})")
        runner.hold_after(0)  # the first step waits
        url = page_server.url.replace("http://", "ws://") + "/v1/ws"
        with connect(url) as ws:
            for i in range(3):
                frame = {"type": "generate", "request_id": f"r{i}", "prompt": f"request {i}"}
                ws.send(json.dumps({**frame, "max_tokens": 64, "ignore_eos": True}))
            # All three in the scheduler, then the held step and one more run with all three:
            # the step after is held (HeldRunner), and the stats published show three running.
            page.wait_for(f"{STATS}.then(s => {admitted} === {num_admitted + 3})")
            assert runner.wait_until_held(120)
            runner.hold_after(2)
            page.wait_for(
                f"{_figure('running')} === '3' && {_figure('streams')} === '3'"
                f" && Number({_figure('gpu-used')}) > 0"
            )
            actors = page.eval(
                "[...document.querySelectorAll('#graph .actor')].map(g => g.dataset.actor)"
            )
            assert sorted(actors) == sorted([*ACTORS, "client"])
            counts = page.eval(
                "Object.fromEntries([...document.querySelectorAll('#graph .channel')]"
                ".map(g => [g.dataset.edge, Number(g.querySelector('text').dataset.count)]))"
            )
            assert counts["client>tokenizer"] >= 3 and counts["scheduler>executor"] >= 3
            assert counts["executor>scheduler"] >= 2 and counts["streamer>client"] >= 2
            rate = "document.querySelector('[data-edge=\"scheduler>executor\"] text').textContent"
            page.wait_for(f"/\\/s$/.test({rate})")  # a second poll: a rate, not a count
            page.screenshot(artifacts / "engine-view.png")
            runner.release()
            done = set()
            while len(done) < 3:
                reply = json.loads(ws.recv(timeout=30))
                if reply["type"] == "done":
                    assert reply["usage"]["completion_tokens"] == 64
                    done.add(reply["request_id"])
        page.wait_for(
            f"{_figure('running')} === '0' && {_figure('waiting')} === '0'"
            f" && {_figure('streams')} === '0' && {_figure('gpu-used')} === '0'"
        )
        page.wait_for(f"{rate} === '0.0/s'")  # no traffic since the last poll
        assert int(page.text("#ev-ttft-count")) >= 3
        page.screenshot(artifacts / "engine-view-idle.png")
        assert page.errors() == []
    finally:
        browser.close_page(page)
