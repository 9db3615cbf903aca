"""Logging: JSON lines through msgspec, every line about a request carries its request_id."""

from __future__ import annotations

import io
import json

import anyio
import pytest
import structlog
from graph_helpers import collect
from troupe import Engine, EngineConfig, SamplingParams
from troupe.logs import configure_logging


@pytest.fixture
def json_debug_logs():  # type: ignore[no-untyped-def]
    stream = io.BytesIO()
    configure_logging("json", "debug", stream)
    yield stream
    structlog.reset_defaults()


def test_json_logs_bind_request_id(json_debug_logs) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        config = EngineConfig(runner="fake", num_kv_blocks=64, num_cpu_blocks=4)
        async with Engine.open(config) as engine:
            await collect(engine, [5, 6, 7], SamplingParams(max_tokens=3), request_id="log-ok")
            await collect(engine, "", SamplingParams(max_tokens=3), request_id="log-bad")

    anyio.run(run)
    text = json_debug_logs.getvalue().decode()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert any(line["event"] == "engine ready" for line in lines)
    about = {
        rid: [ln for ln in lines if ln.get("request_id") == rid] for rid in ("log-ok", "log-bad")
    }
    assert [ln["event"] for ln in about["log-ok"]] == ["request received", "request ended"]
    assert about["log-ok"][-1]["finish_reason"] == "length"
    assert about["log-ok"][-1]["completion_tokens"] == 3
    ended = about["log-bad"][-1]
    assert ended["event"] == "request ended" and ended["finish_reason"] == "rejected"
    assert "prompt" in ended["message"]
    for line in lines:
        assert line["level"] in {"debug", "info", "warning", "error"} and "timestamp" in line
        if "request" in line["event"]:
            assert "request_id" in line, line


def test_bad_log_level_names_the_field() -> None:
    with pytest.raises(ValueError, match="log_level"):
        configure_logging("json", "chatty")
