"""Headless Chromium for the page tests, driven over the DevTools protocol (no DOM emulator).

One `Browser` per test module (the `browser` fixture); each test opens a fresh `Page`. Waits
are conditions evaluated in the page (`Page.wait_for`): a JavaScript expression, awaited if it
is a promise, re-checked until it holds; the deadline only turns a hang into a failure. Events
the page emits (websocket frames, dialogs) are kept in `Page.events`; a dialog (`alert`) is
recorded and dismissed so that it cannot block the page. Needs Debian's chromium
(.ci/install-browser.sh).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HANG_SECONDS = 30.0  # only a hang detector: every wait ends on a condition in the page

_WAIT = """new Promise((resolve, reject) => {
  const deadline = Date.now() + %d;
  const check = async () => {
    let value;
    try { value = await (%s); } catch (err) { reject(err); return; }
    if (value) { resolve(value); return; }
    if (Date.now() > deadline) { reject(new Error("timed out waiting for: " + %s)); return; }
    setTimeout(check, 20);
  };
  check();
})"""


class Page:
    """One tab: DevTools commands, evaluation, waits, input, screenshots, recorded events."""

    def __init__(self, ws: ClientConnection, target_id: str) -> None:
        self.ws = ws  # entered by the Browser, closed by close_page
        self.target_id = target_id
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=HANG_SECONDS + 10))
            if msg.get("id") == call_id:
                assert "error" not in msg, msg
                return msg["result"]  # type: ignore[no-any-return]
            if "method" in msg:
                self._on_event(msg)

    def _on_event(self, msg: dict[str, Any]) -> None:
        self.events.append(msg)
        if msg["method"] == "Page.javascriptDialogOpening":  # never let alert() block the page
            call_id = next(self._ids)
            self.ws.send(
                json.dumps(
                    {
                        "id": call_id,
                        "method": "Page.handleJavaScriptDialog",
                        "params": {"accept": False},
                    }
                )
            )

    def eval(self, expression: str) -> Any:
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise AssertionError(details.get("exception", {}).get("description", details))
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = HANG_SECONDS) -> Any:
        """The expression's value once it is truthy (it may be a promise)."""
        return self.eval(_WAIT % (timeout * 1000, expression, json.dumps(expression)))

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.body && document.body.dataset.ready === 'true'")

    def click(self, selector: str) -> None:
        """A real mouse click at the element's centre."""
        x, y = self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def type_text(self, selector: str, text: str) -> None:
        """Focus an input and type into it, as a keyboard would (input events fire)."""
        self.eval(f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", text=text)

    def press_enter(self, *, shift: bool = False) -> None:
        common = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13}
        modifiers = 8 if shift else 0
        self.send(
            "Input.dispatchKeyEvent", type="keyDown", text="\r", modifiers=modifiers, **common
        )
        self.send("Input.dispatchKeyEvent", type="keyUp", modifiers=modifiers, **common)

    def fill(self, selector: str, value: str) -> None:
        """Set a form field's value and fire `change`, as a user leaving the field would."""
        self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            f" e.value = {json.dumps(value)};"
            " e.dispatchEvent(new Event('input')); e.dispatchEvent(new Event('change')); })()"
        )

    def text(self, selector: str) -> str:
        return str(self.eval(f"document.querySelector({json.dumps(selector)}).textContent"))

    def screenshot(self, path: Path) -> None:
        shot = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def ws_frames(self, direction: str) -> list[dict[str, Any]]:
        """JSON frames the page sent ("Sent") or received ("Received") on its websockets."""
        method = f"Network.webSocketFrame{direction}"
        self.eval("0")  # read what is pending
        return [
            json.loads(e["params"]["response"]["payloadData"])
            for e in self.events
            if e["method"] == method
        ]

    def errors(self) -> list[str]:
        """Uncaught exceptions and console errors (a CSP refusal, a failed load) so far."""
        self.eval("0")  # read what is pending
        out = []
        for e in self.events:
            if e["method"] == "Runtime.exceptionThrown":
                out.append(str(e["params"]["exceptionDetails"].get("exception", {})))
            elif e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error":
                out.append(e["params"]["entry"]["text"])
        return out

    def dialogs(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["method"] == "Page.javascriptDialogOpening"]


class Browser:
    """A headless Chromium process; `open(url)` gives a fresh tab (`close` it after)."""

    def __init__(self, profile: Path) -> None:
        self._proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",
                "--window-size=1200,860",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._port = self._devtools_port(profile)
        self._pages: list[Page] = []
        self._stack = contextlib.ExitStack()  # the pages' DevTools connections

    def _devtools_port(self, profile: Path) -> int:
        marker = profile / "DevToolsActivePort"
        deadline = time.monotonic() + HANG_SECONDS
        while time.monotonic() < deadline:  # chromium writes the file once it listens
            if marker.exists() and marker.read_text().strip():
                return int(marker.read_text().splitlines()[0])
            assert self._proc.poll() is None, f"chromium exited with {self._proc.returncode}"
            time.sleep(0.05)
        raise AssertionError("chromium did not open its DevTools port")

    def open(self, url: str) -> Page:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self._port}/json/new?about:blank", method="PUT"
        )
        with urllib.request.urlopen(request, timeout=HANG_SECONDS) as resp:
            target = json.load(resp)
        ws = self._stack.enter_context(connect(target["webSocketDebuggerUrl"], max_size=None))
        page = Page(ws, target["id"])
        for domain in ("Page", "Network", "Runtime", "Log"):
            page.send(f"{domain}.enable")
        page.goto(url)
        self._pages.append(page)
        return page

    def close_page(self, page: Page) -> None:
        page.ws.close()
        url = f"http://127.0.0.1:{self._port}/json/close/{page.target_id}"
        with urllib.request.urlopen(url, timeout=HANG_SECONDS):
            pass
        self._pages.remove(page)

    def close(self) -> None:
        self._stack.close()
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
