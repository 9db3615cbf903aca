"""The playground page in headless Chromium, driven over the DevTools protocol.

Types a prompt, presses Generate, watches text stream in, presses Stop, and saves a
screenshot to artifacts/playground.png. Needs Debian's chromium (.ci/install-browser.sh).
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class Page:
    """A minimal DevTools-protocol client for one page target."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == call_id:
                assert "error" not in msg, msg
                return msg["result"]  # type: ignore[no-any-return]

    def eval(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := self.eval(expression):
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expression}")

    def click(self, element_id: str) -> None:
        """A real mouse click at the element's centre."""
        box = self.eval(
            f"(() => {{ const r = document.getElementById('{element_id}').getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box[0],
                y=box[1],
                button="left",
                clickCount=1,
            )


def _devtools_port(profile: Path, proc: subprocess.Popen[bytes]) -> int:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if marker.exists() and marker.read_text().strip():
            return int(marker.read_text().splitlines()[0])
        assert proc.poll() is None, f"chromium exited with {proc.returncode}"
        time.sleep(0.05)
    raise AssertionError("chromium did not open its DevTools port")


@pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="chromium is not installed (run .ci/install-browser.sh)"
)
def test_playground_streams_and_stops(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = tmp_path / "profile"
    proc = subprocess.Popen(
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
            "--window-size=1100,720",
            f"{server.url}/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port = _devtools_port(profile, proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            targets = json.load(resp)
        target = next(t for t in targets if t["type"] == "page" and t["url"].startswith(server.url))
        with connect(target["webSocketDebuggerUrl"], max_size=None) as ws:
            page = Page(ws)
            page.wait_for(
                "document.readyState === 'complete' && !!document.getElementById('generate')"
            )
            assert (
                page.eval("document.getElementById('model').textContent")
                == server.engine.model_name
            )
            page.eval("document.getElementById('max-tokens').value = '8000'")
            page.eval(
                "(() => { const p = document.getElementById('prompt'); p.value = ''; p.focus(); })()"
            )
            page.send("Input.insertText", text="Tell me a story about actors.")
            assert (
                page.eval("document.getElementById('prompt').value")
                == "Tell me a story about actors."
            )
            page.click("generate")
            page.wait_for("document.getElementById('output').textContent.length > 20")
            assert page.eval("document.getElementById('status').textContent") == "streaming"
            page.click("stop")
            status = page.wait_for(
                "(() => { const s = document.getElementById('status').textContent;"
                " return s === 'streaming' || s === 'waiting' ? '' : s; })()"
            )
            assert status == "stopped"
            text = page.eval("document.getElementById('output').textContent")
            ntokens = int(page.eval("document.getElementById('ntokens').textContent"))
            assert text and 0 < ntokens < 8000
            assert page.eval("document.getElementById('ttft').textContent").endswith(" ms")
            assert float(page.eval("document.getElementById('tps').textContent")) > 0
            assert page.eval("document.getElementById('generate').disabled") is False
            shot = page.send("Page.captureScreenshot", format="png")
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "playground.png").write_bytes(base64.b64decode(shot["data"]))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    server.wait_idle()
