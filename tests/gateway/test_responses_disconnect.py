"""A /v1/responses client that goes away aborts its request, streamed or not: the runner holds
the request's steps, so it cannot end by itself before the client hangs up, and the engine's
terminal event for it is an Aborted."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner
from troupe.messages import Aborted, StreamEvent

from tests.gateway.conftest import BASE_CONFIG, open_post

HANG = 60  # s: a hang detector only
LONG = {"input": "x", "max_output_tokens": 200, "ignore_eos": True}


def _until(done: Any) -> None:
    deadline = time.monotonic() + HANG
    while not done():
        assert time.monotonic() < deadline, "hung"
        time.sleep(0.01)


@pytest.mark.parametrize("stream", [True, False])
def test_a_vanished_client_aborts_its_request(make_server: Any, stream: bool) -> None:
    runner = FaultyRunner(FakeRunner.from_config(BASE_CONFIG))
    srv = make_server(BASE_CONFIG, runner=runner)
    ends: list[StreamEvent] = []
    lock = threading.Lock()

    def on_event(event: StreamEvent, _: float) -> None:
        if event.request_id.startswith("resp_") and event.is_terminal:
            with lock:
                ends.append(event)

    srv.engine.add_event_listener(on_event)
    runner.hold_after(3)  # the request's later steps wait until released
    sock = open_post(srv.url, "/v1/responses", {**LONG, "stream": stream})
    if stream:
        seen = b""
        while b"response.output_text.delta" not in seen:
            seen += sock.recv(65536)
    assert runner.wait_until_held(HANG)
    sock.close()
    _until(lambda: srv.gateway.num_streams == 0)  # the handler let go: the engine was told
    runner.release()
    _until(lambda: ends)
    assert len(ends) == 1 and isinstance(ends[0], Aborted), ends
