"""An engine child whose server is gone never outlives it: on its socket's end of file it
stops in order, and if its runner is stuck inside a step (held here by ChildRunnerGate, so the
step is certain to be in flight) it exits hard with ORPHAN_EXIT_CODE once
orphan_stop_timeout_s has passed. The child is driven over a raw socket, as the gateway's
RemoteEngine would, so that the test can see its exit status."""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess

import pytest
from troupe.config import ConfigError, EngineConfig
from troupe.gateway.engine_process import run_engine_process
from troupe.gateway.orphan_exit import ORPHAN_EXIT_CODE
from troupe.messages import GenerateRequest, SamplingParams
from troupe.messages.engine_protocol import (
    FrameSplitter,
    FromEngine,
    Generate,
    Hello,
    encode_frame,
    from_engine_decoder,
)

from tests.gateway.conftest import BASE_CONFIG
from tests.gateway.engine_process_faults import ChildRunnerGate

HANG = 60  # s: a hang detector only, never a measure


@contextmanager
def _engine_child(
    config: EngineConfig, gate: ChildRunnerGate
) -> Iterator[tuple[socket.socket, BaseProcess]]:
    """The engine process on one end of a socketpair (as open_remote_engine starts it), a
    request in flight whose second step is held; yields the parent's end and the process."""
    parent_sock, child_sock = socket.socketpair()
    process = multiprocessing.get_context("spawn").Process(
        target=run_engine_process, args=(child_sock, config, gate.factory)
    )
    process.start()
    child_sock.close()  # the child's copy alone keeps its end open, as the gateway's
    try:
        parent_sock.settimeout(HANG)
        assert isinstance(_receive(parent_sock), Hello)
        params = SamplingParams(max_tokens=1000, ignore_eos=True)
        request = GenerateRequest(
            request_id="r1", params=params, arrival_time=0.0, prompt_token_ids=(1, 2, 3)
        )
        parent_sock.sendall(encode_frame(Generate(request=request)))
        assert gate.wait_until_held(HANG)  # the step is in flight and cannot return
        yield parent_sock, process
    finally:
        gate.release()
        parent_sock.close()
        process.join(HANG)
        if process.exitcode is None:
            process.kill()
            process.join()


def _receive(sock: socket.socket) -> FromEngine:
    """The first frame the child sends."""
    splitter = FrameSplitter()
    while True:
        data = sock.recv(65536)
        assert data, "the engine process closed its socket before its first frame"
        bodies = splitter.feed(data)
        if bodies:
            return from_engine_decoder.decode(bodies[0])


def test_an_orphan_stuck_in_a_step_exits_hard() -> None:
    gate = ChildRunnerGate(hang_at_step=2)
    with _engine_child(BASE_CONFIG.replace(orphan_stop_timeout_s=0.2), gate) as (sock, process):
        sock.close()  # the server is gone; the held step never returns (no release)
        process.join(HANG)
        assert process.exitcode == ORPHAN_EXIT_CODE


def test_an_orphan_whose_step_returns_stops_in_order() -> None:
    """The same end of file with a step that does return: a clean stop, status 0 (the hard
    exit is a bound that a healthy stop never meets)."""
    gate = ChildRunnerGate(hang_at_step=2)
    with _engine_child(BASE_CONFIG.replace(orphan_stop_timeout_s=HANG), gate) as (sock, process):
        sock.close()
        gate.release()
        process.join(HANG * 2)
        assert process.exitcode == 0


def test_orphan_stop_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="orphan_stop_timeout_s must be > 0, got 0"):
        EngineConfig(orphan_stop_timeout_s=0)
