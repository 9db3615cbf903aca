"""A real gateway + fake-runner engine on 127.0.0.1 (ephemeral ports), in a background thread.

The server runs its own asyncio loop in a thread, so tests can use blocking clients (openai,
chromium) as well as async ones. The engine runs in a child process, as `troupe serve` runs it
(GatewaySettings.engine_process), unless a test injects a runner object.
`ServerThread.add_gateway` serves a second app (other settings, e.g. an API key) on the same
engine, without paying another engine start.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from openai import OpenAI
from troupe.config import EngineConfig
from troupe.gateway.app import build_app
from troupe.gateway.server import listen, serve
from troupe.gateway.state import GATEWAY, GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner

# Fake runner: deterministic, fast. 2000 blocks of 16 tokens: room for 200 requests of ~150 tokens; long ones stop early.
# No heap freeze: these servers share the test process, whose other tests see its collector.
BASE_CONFIG = EngineConfig(
    runner="fake",
    device="cpu",
    num_kv_blocks=2000,
    num_cpu_blocks=64,
    max_model_len=8192,
    gc_freeze=False,
)


class ServerThread:
    """`serve()` in a thread; `url` and `engine` once ready; `shutdown()` drains it."""

    def __init__(
        self,
        config: EngineConfig,
        settings: GatewaySettings,
        *,
        shutdown_grace: float = 5.0,
        runner: Any = None,
        runner_factory: Any = None,
    ) -> None:
        self.config = config
        self.runner = runner  # an injected runner (e.g. a FaultyRunner), or None
        self.runner_factory = runner_factory  # builds the engine process's runner, or None
        self.settings = settings
        self.shutdown_grace = shutdown_grace
        self.url = ""
        self.engine: Any = None
        self.gateway: Any = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="gateway-server", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._runners: list[web.AppRunner] = []

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(120):
            raise TimeoutError("the gateway did not become ready in 120 s")
        if self.error is not None:
            raise RuntimeError("the gateway failed to start") from self.error
        return self

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()

        def on_ready(url: str, app: web.Application) -> None:
            self.url, self.gateway = url, app[GATEWAY]
            self.engine = self.gateway.engine
            self._ready.set()

        try:
            await serve(
                self.config,
                self.settings,
                host="127.0.0.1",
                port=0,
                shutdown_grace=self.shutdown_grace,
                stop=self._stop,
                on_ready=on_ready,
                runner=self.runner,
                runner_factory=self.runner_factory,
            )
        except BaseException as exc:  # surfaced by start() / shutdown()
            self.error = exc
        finally:
            for runner in self._runners:
                await runner.cleanup()
            self._ready.set()

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def add_gateway(self, settings: GatewaySettings) -> str:
        """Serve another app on the same engine; returns its URL."""

        async def start() -> str:
            # The same listener as `troupe serve`: gate, timeouts and connection cap included.
            runner = await listen(build_app(self.engine, settings), settings, "127.0.0.1", 0)
            self._runners.append(runner)
            host, port = runner.addresses[0][:2]
            return f"http://{host}:{port}"

        return str(self.call(start()))

    def begin_shutdown(self) -> None:
        """Like SIGTERM: start draining; returns at once."""
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)

    def join(self, timeout: float = 60.0) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the gateway did not stop within {timeout} s")
        if self.error is not None:
            raise RuntimeError("the gateway failed") from self.error

    def wait_idle(self, timeout: float = 120.0) -> None:
        """Until no stream is open and no GPU block is owned by a request (blocking poll)."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.engine.stats()
            busy = stats.num_running + stats.num_waiting + stats.num_swapped
            if self.engine.num_active == 0 and stats.num_gpu_blocks_used == 0 and busy == 0:
                return
            assert time.monotonic() < deadline, f"engine still busy after {timeout} s: {stats}"
            time.sleep(0.02)

    def shutdown(self) -> None:
        if self._thread.is_alive():
            self.begin_shutdown()
        self.join()


def openai_client(url: str, timeout: float = 30) -> OpenAI:
    """The official client on a server's /v1, without retries (a test sees the first answer)."""
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=timeout)


def scripted_server(
    folder: Path, settings: GatewaySettings, vocab_size: int | None = None
) -> ServerThread:
    """A server, not started yet, on the model in `folder` (scripted_runner.template_model)
    around a ScriptedRunner: `say(srv, text)` makes the model answer `text`. `vocab_size`: the
    model's, where the tokenizer has more tokens than SmolLM2's (the fake runner's default)."""
    from tests.gateway.scripted_runner import ScriptedRunner

    config = BASE_CONFIG.replace(model=str(folder))
    inner = FakeRunner.from_config(config)
    if vocab_size is not None:
        inner.vocab_size = vocab_size
    return ServerThread(config, settings, runner=ScriptedRunner(inner))


def post_json(url: str, path: str, body: object) -> tuple[int, Any]:
    """POST `body` as JSON to `url` + `path`: (status, the decoded JSON answer), errors too."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"{url}{path}", data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def open_post(url: str, path: str, body: dict[str, Any]) -> socket.socket:
    """A POST sent on a raw socket whose answer is not read: a client that can vanish."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    data = json.dumps(body).encode()
    sock.sendall(
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data)
    )
    return sock


@pytest.fixture(scope="session")
def server() -> Iterator[ServerThread]:
    """One shared server for the tests that do not stop it."""
    srv = ServerThread(BASE_CONFIG, GatewaySettings()).start()
    yield srv
    srv.shutdown()


@pytest.fixture(scope="module")
def smol() -> Iterator[ServerThread]:
    """A server on the real default model (SmolLM2 on the CPU), for one module's tests: not
    longer (its gateway freezes this process's heap, which other tests count)."""
    config = EngineConfig(device="cpu", max_model_len=256, num_kv_blocks=32, max_num_seqs=4)
    srv = ServerThread(config, GatewaySettings()).start()
    yield srv
    srv.shutdown()


@pytest.fixture
def anyio_backend() -> str:
    """aiohttp's client and the gateway run on asyncio."""
    return "asyncio"


@pytest.fixture(scope="module")
def tight_server() -> Iterator[ServerThread]:
    """An engine that one running and one queued request fill (for 429); short drain grace.
    Its runner can hold a step until the test releases it (`srv.runner`, a FaultyRunner)."""
    config = BASE_CONFIG.replace(max_num_seqs=1, max_queued_requests=1)
    runner = FaultyRunner(FakeRunner.from_config(config))
    srv = ServerThread(config, GatewaySettings(), shutdown_grace=0.5, runner=runner).start()
    yield srv
    runner.release()
    srv.shutdown()


@pytest.fixture
def make_server() -> Iterator[Any]:
    """Start a ServerThread of one's own: `make_server(config, runner=...)`; stopped after."""
    started: list[ServerThread] = []

    def make(config: EngineConfig = BASE_CONFIG, **kwargs: Any) -> ServerThread:
        srv = ServerThread(config, GatewaySettings(), **kwargs).start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        if srv.runner is not None:
            srv.runner.release()
        if srv._thread.is_alive():
            srv.shutdown()


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[ServerThread]:
    """A short max_model_len: a valid request with a huge max_tokens still ends in ~100 steps."""
    config = BASE_CONFIG.replace(max_model_len=128, num_kv_blocks=512, num_cpu_blocks=16)
    srv = ServerThread(config, GatewaySettings(max_body_bytes=256 * 1024)).start()
    yield srv
    srv.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium per test module (skips where chromium is not installed)."""
    from tests.gateway.browser import CHROMIUM, Browser

    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (run .ci/install-browser.sh)")
    chromium = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield chromium
    chromium.close()


@pytest.fixture(scope="module")
def page_server() -> Iterator[ServerThread]:
    """An in-process engine whose runner the page tests steer: `srv.runner` holds steps
    (HeldRunner.hold_after/release) and `srv.runner.inner.script` makes exact replies."""
    from tests.gateway.scripted_runner import HeldRunner, ScriptedRunner

    runner = HeldRunner(ScriptedRunner(FakeRunner.from_config(BASE_CONFIG)))
    srv = ServerThread(BASE_CONFIG, GatewaySettings(), runner=runner).start()
    yield srv
    runner.release()
    srv.shutdown()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the page tests save screenshots: $TROUPE_TEST_ARTIFACTS, else a pytest tmp dir."""
    chosen = os.environ.get("TROUPE_TEST_ARTIFACTS")
    path = Path(chosen) if chosen else tmp_path_factory.mktemp("artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path
