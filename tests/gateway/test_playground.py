"""The chat page in headless Chromium: multi-turn, Stop, safe rendering, keyboard, the key,
the model picker.

The engine runs in this process with a steerable runner (`page_server`): the fake runner's
reply is a function of the prompt, so a reply that depends on the history is checkable;
FaultyRunner.hold_after pins a stream mid-way; ScriptedRunner makes exact replies.
`lora_server` serves LoRA adapters (by name only: the fake runner reads no folder) and records
the SamplingParams that reach its runner.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner

from tests.gateway.browser import Browser, Page
from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.scripted_runner import ParamsRecorder

MAX_TOKENS = 8
REPLY = "#messages .msg.assistant"
LORA_CONFIG = BASE_CONFIG.replace(lora_modules=("sql=/adapters/sql", "chat-v2=/adapters/chat"))


@pytest.fixture(scope="module")
def lora_server() -> Iterator[ServerThread]:
    runner = ParamsRecorder(FakeRunner.from_config(LORA_CONFIG))
    srv = ServerThread(LORA_CONFIG, GatewaySettings(), runner=runner).start()
    yield srv
    srv.shutdown()


@pytest.fixture
def page(browser: Browser, page_server: Any) -> Iterator[Page]:
    tab = browser.open(f"{page_server.url}/")
    yield tab
    errors = tab.errors()
    browser.close_page(tab)
    assert errors == []
    page_server.runner.release()
    page_server.runner.inner.script = None
    page_server.wait_idle()


def _say(page: Page, text: str) -> None:
    page.type_text("#prompt", text)
    page.press_enter()


def _wait_reply_done(page: Page, count: int) -> str:
    """The status once the `count`-th reply has ended."""
    page.wait_for(
        f"document.querySelectorAll('{REPLY}').length === {count}"
        " && !document.getElementById('send').disabled"
    )
    return page.text("#status")


def _generate_frames(page: Page) -> list[dict[str, Any]]:
    return [f for f in page.ws_frames("Sent") if f["type"] == "generate"]


def _reply_text(page: Page, request_id: str) -> str:
    frames = page.ws_frames("Received")
    return "".join(f["text"] for f in frames if f["request_id"] == request_id and "text" in f)


def _chat_completion(page: Page, frame: dict[str, Any], messages: list[dict[str, str]]) -> str:
    """The same request over HTTP, from inside the page (same origin, no key)."""
    params = {k: v for k, v in frame.items() if k not in ("type", "request_id", "messages")}
    body = json.dumps({"messages": messages, **params})
    return str(
        page.eval(
            "fetch('/v1/chat/completions', {method: 'POST', headers: {'Content-Type':"
            f" 'application/json'}}, body: {json.dumps(body)}}})"
            ".then(r => r.json()).then(b => b.choices[0].message.content)"
        )
    )


def test_three_turns_each_reply_follows_the_history(
    page: Page, page_server: Any, artifacts: Path
) -> None:
    page.fill("#max-tokens", str(MAX_TOKENS))
    page.fill("#system", "You are terse.")
    for turn, question in enumerate(["Who are you?", "And the troupe?", "Thanks."], 1):
        _say(page, question)
        assert _wait_reply_done(page, turn) == "done (length)"
    frames = _generate_frames(page)
    assert len(frames) == 3
    replies = [_reply_text(page, f["request_id"]) for f in frames]
    assert all(replies) and len(set(replies)) == 3
    # Each request carries the whole conversation, the model's replies included.
    assert frames[1]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Who are you?"},
        {"role": "assistant", "content": replies[0]},
        {"role": "user", "content": "And the troupe?"},
    ]
    assert frames[2]["messages"][4:] == [
        {"role": "assistant", "content": replies[1]},
        {"role": "user", "content": "Thanks."},
    ]
    assert frames[1]["max_tokens"] == MAX_TOKENS
    # Only the base model is served: no picker, and the frames name the base model.
    assert {f["model"] for f in frames} == {page_server.engine.model_name}
    assert page.eval("document.getElementById('model-setting').hidden") is True
    # The fake model's reply is a function of its prompt: the second reply is the one that
    # history gives, and a different first reply would have given another.
    assert _chat_completion(page, frames[1], frames[1]["messages"]) == replies[1]
    other = [*frames[1]["messages"][:2], {"role": "assistant", "content": "Nobody."}]
    assert _chat_completion(page, frames[1], [*other, frames[1]["messages"][3]]) != replies[1]
    metas = page.eval(
        f"[...document.querySelectorAll('{REPLY} .meta')].map(m =>"
        " [m.querySelector('.ttft').textContent, m.querySelector('.ntokens').textContent,"
        " m.querySelector('.finish').textContent])"
    )
    assert [m[1:] for m in metas] == [[f"{MAX_TOKENS} tokens", "length"]] * 3
    assert all(m[0].startswith("TTFT ") and m[0].endswith(" ms") for m in metas)
    page.screenshot(artifacts / "chat.png")

    # Regenerate: the last reply is asked again with the same history (same fake answer).
    page.eval(f"[...document.querySelectorAll('{REPLY}')].at(-1).dataset.old = 'yes'")
    page.click("#regenerate")
    page.wait_for("!document.querySelector('[data-old]')")
    assert _wait_reply_done(page, 3) == "done (length)"
    again = _generate_frames(page)[3]
    assert again["messages"] == frames[2]["messages"]
    assert _reply_text(page, again["request_id"]) == replies[2]


def test_stop_aborts_the_request_in_the_engine(page: Page, page_server: Any) -> None:
    runner = page_server.runner
    page.fill("#max-tokens", "500")
    runner.hold_after(3)  # three tokens, then the fourth step waits
    _say(page, "Tell me a long story.")
    assert runner.wait_until_held(120)
    page.wait_for(
        f"/^[1-9]\\d* tokens$/.test(document.querySelector('{REPLY} .ntokens')?.textContent)"
    )
    assert page.text("#status") == "streaming"
    stats = "fetch('/v1/engine/stats').then(r => r.json())"
    assert page.eval(f"{stats}.then(s => s.engine.num_running)") == 1
    sent_to_scheduler = (
        "s.graph.actors.find(a => a.name === 'admission').sent"
        ".find(c => c.receiver === 'scheduler').num_messages"
    )
    num_before = page.eval(f"{stats}.then(s => {sent_to_scheduler})")
    page.click("#stop")
    # The abort is queued at the scheduler before the held step's result: it wins.
    page.wait_for(f"{stats}.then(s => {sent_to_scheduler} === {num_before + 1})")
    runner.release()
    assert _wait_reply_done(page, 1) == "stopped"
    done = [f for f in page.ws_frames("Received") if f["type"] == "done"]
    assert [d["finish_reason"] for d in done] == ["abort"]
    partial = _reply_text(page, done[0]["request_id"])
    assert partial and 1 <= done[0]["usage"]["completion_tokens"] < 500
    assert page.text(f"{REPLY} .finish") == "stopped"
    # Freed in the engine: nothing running, no block held.
    assert page.wait_for(
        f"{stats}.then(s => s.engine.num_running === 0 && s.engine.num_gpu_blocks_used === 0"
        " && s.num_streams === 0)"
    )
    # The stopped reply stays in the conversation; the next turn carries it.
    page.fill("#max-tokens", "4")
    _say(page, "Go on.")
    assert _wait_reply_done(page, 2) == "done (length)"
    assert _generate_frames(page)[1]["messages"][-2:] == [
        {"role": "assistant", "content": partial},
        {"role": "user", "content": "Go on."},
    ]


SCRIPT = (
    "Look: <script>alert('x')</script> and <img src=x onerror=alert(1)>\n\n"
    "```html\n<script>alert(2)</script>\n```\n"
    "**bold** and [a link](javascript:alert(3)) and [troupe](https://example.com/)"
)


def test_reply_with_script_is_rendered_as_text(page: Page, page_server: Any) -> None:
    tokenizer = page_server.engine.tokenizer
    script = tokenizer.encode(SCRIPT, add_special_tokens=False)
    assert tokenizer.decode(script) == SCRIPT
    page_server.runner.inner.script = tuple(script)
    page.fill("#max-tokens", str(len(script)))
    num_scripts = page.eval("document.scripts.length")
    _say(page, "Show me some HTML.")
    assert _wait_reply_done(page, 1) == "done (length)"
    body = f"document.querySelector('{REPLY} .body')"
    text = page.eval(f"{body}.textContent")
    assert "<script>alert('x')</script>" in text and "<img src=x onerror=alert(1)>" in text
    assert page.eval("document.scripts.length") == num_scripts
    assert page.eval("document.querySelectorAll('#messages script, #messages img').length") == 0
    assert page.eval("document.querySelectorAll('[onerror]').length") == 0
    assert page.eval(f"{body}.querySelector('pre code').textContent") == "<script>alert(2)</script>"
    assert page.eval(f"{body}.querySelector('strong').textContent") == "bold"
    links = page.eval(f"[...{body}.querySelectorAll('a')].map(a => a.href)")
    assert links == ["https://example.com/"]  # the javascript: one stays text
    assert page.dialogs() == []


def test_keyboard_alone(page: Page) -> None:
    page.fill("#max-tokens", "4")
    page.type_text("#prompt", "line one")
    page.press_enter(shift=True)
    page.send("Input.insertText", text="line two")
    assert page.eval("document.getElementById('prompt').value") == "line one\nline two"
    assert page.eval("document.querySelectorAll('#messages .msg').length") == 0
    page.press_enter()
    assert _wait_reply_done(page, 1) == "done (length)"
    assert page.text("#messages .msg.user .body") == "line one\nline two"
    assert page.eval("document.getElementById('prompt').value") == ""
    page.click("#new-chat")  # a fresh conversation: only the system prompt and the new turn
    assert page.eval("document.querySelectorAll('#messages .msg').length") == 0
    _say(page, "again")
    assert _wait_reply_done(page, 1) == "done (length)"
    assert [m["role"] for m in _generate_frames(page)[-1]["messages"]] == ["system", "user"]


def test_max_tokens_bounded_by_the_context(page: Page, page_server: Any) -> None:
    limit = page_server.engine.max_model_len
    page.wait_for(f"document.getElementById('max-tokens').max === '{limit}'")
    page.fill("#max-tokens", str(limit + 1))
    _say(page, "Too long?")
    assert "max tokens must be a whole number in [1, " in page.text("#status")
    assert _generate_frames(page) == []  # never sent


def test_narrow_screen(page: Page, artifacts: Path) -> None:
    page.send(
        "Emulation.setDeviceMetricsOverride",
        width=380,
        height=760,
        deviceScaleFactor=1,
        mobile=True,
    )
    page.send("Page.reload")
    page.wait_for("document.body && document.body.dataset.ready === 'true'")
    assert page.eval("document.getElementById('settings').open") is False
    page.fill("#max-tokens", "12")
    _say(page, "A long line " * 20)
    assert _wait_reply_done(page, 1) == "done (length)"
    assert page.eval("document.documentElement.scrollWidth <= window.innerWidth")
    page.screenshot(artifacts / "chat-narrow.png")
    page.send("Emulation.clearDeviceMetricsOverride")


def test_model_picker_runs_the_chosen_adapter(
    browser: Browser, lora_server: Any, artifacts: Path
) -> None:
    base = lora_server.engine.model_name
    page = browser.open(f"{lora_server.url}/")
    try:
        page.wait_for("!document.getElementById('model-setting').hidden")
        options = page.eval(
            "[...document.querySelectorAll('#model-pick option')]"
            ".map(o => [o.value, o.text, o.parentElement.label ?? null])"
        )
        assert options == [  # the base model first, then its adapters, grouped under it
            [base, base, None],
            ["sql", "sql", f"LoRA adapters of {base}"],
            ["chat-v2", "chat-v2", f"LoRA adapters of {base}"],
        ]
        assert page.eval("document.getElementById('model-pick').value") == base
        assert page.text("#model-kind") == "(the base model)"
        page.fill("#max-tokens", "4")
        page.fill("#model-pick", "sql")
        assert page.text("#model-kind") == f"(a LoRA adapter of {base})"
        lora_server.runner.take()
        _say(page, "Write a query.")
        assert _wait_reply_done(page, 1) == "done (length)"
        page.screenshot(artifacts / "chat-lora.png")
        page.fill("#model-pick", base)
        _say(page, "Now without the adapter.")
        assert _wait_reply_done(page, 2) == "done (length)"
        frames = _generate_frames(page)
        assert [f["model"] for f in frames] == ["sql", base]
        # What the engine ran: the adapter, then the base model (engine ids end with the page's).
        seen = lora_server.runner.params
        for frame, lora in zip(frames, ["sql", None], strict=True):
            (params,) = [p for rid, p in seen.items() if rid.endswith(f"-{frame['request_id']}")]
            assert params.lora == lora
        assert page.errors() == []
    finally:
        browser.close_page(page)
        lora_server.wait_idle()


def test_api_key_stays_out_of_urls_and_storage(browser: Browser, page_server: Any) -> None:
    url = page_server.add_gateway(GatewaySettings(api_key="s3cret-key"))
    page = browser.open(f"{url}/")
    try:
        page.wait_for("document.getElementById('key-status').textContent.includes('API key')")
        page.fill("#api-key", "s3cret-key")
        page.wait_for("document.getElementById('key-status').textContent === 'key accepted'")
        page.fill("#max-tokens", "4")
        _say(page, "hello")
        assert _wait_reply_done(page, 1) == "done (length)"
        urls = [
            e["params"].get("url") or e["params"].get("request", {}).get("url", "")
            for e in page.events
            if e["method"] in ("Network.webSocketCreated", "Network.requestWillBeSent")
        ]
        assert urls and not any("s3cret" in u or "api_key" in u for u in urls)
        assert page.eval("localStorage.length + sessionStorage.length") == 0
        assert page.eval("document.cookie") == ""
    finally:
        browser.close_page(page)
