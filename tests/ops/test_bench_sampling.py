"""`troupe bench serve`'s sampling flags (vLLM's --top-p, --top-k, ...): each request carries
the ones given, over HTTP as OpenAI fields and in-process as SamplingParams fields."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from troupe.messages import SamplingParams
from troupe.ops.bench_serve_args import build_parser, sampling_fields
from troupe.ops.serve_client import EngineClient, HttpClient
from troupe.ops.serve_workload import BenchRequest

FLAGS = ["--top-p", "0.9", "--top-k", "20", "--min-p", "0.05", "--presence-penalty", "0.5"]
FIELDS = {"top_p": 0.9, "top_k": 20, "min_p": 0.05, "presence_penalty": 0.5}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # aiohttp


def test_only_the_flags_given_become_fields() -> None:
    assert sampling_fields(build_parser().parse_args(FLAGS)) == FIELDS
    assert sampling_fields(build_parser().parse_args([])) == {}
    assert isinstance(sampling_fields(build_parser().parse_args(FLAGS))["top_k"], int)


@pytest.mark.anyio
async def test_http_requests_carry_them() -> None:
    seen: list[dict[str, Any]] = []

    async def completions(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response({"error": {"message": "seen"}}, status=400)

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession() as session:
            client = HttpClient(
                session, f"http://{host}:{port}", model="m", temperature=0.7,
                ignore_eos=True, sampling=FIELDS,
            )  # fmt: skip
            await client.send(BenchRequest(index=0, prompt_ids=[1], output_len=2, arrival_s=0.0))
    finally:
        await runner.cleanup()
    assert {k: seen[0][k] for k in FIELDS} == FIELDS and seen[0]["temperature"] == 0.7


class _Engine:
    """Notes the params of each generate() and answers nothing."""

    def __init__(self) -> None:
        self.params: list[SamplingParams] = []

    async def generate(self, prompt: list[int], params: SamplingParams) -> AsyncIterator[Any]:
        self.params.append(params)
        return
        yield


@pytest.mark.anyio
async def test_engine_requests_carry_them() -> None:
    engine = _Engine()
    client = EngineClient(engine, temperature=0.7, ignore_eos=True, sampling=FIELDS)
    await client.send(BenchRequest(index=0, prompt_ids=[1], output_len=2, arrival_s=0.0))
    params = engine.params[0]
    assert (params.top_p, params.top_k, params.min_p, params.presence_penalty) == (
        0.9, 20, 0.05, 0.5,
    )  # fmt: skip
    assert (params.temperature, params.max_tokens, params.ignore_eos) == (0.7, 2, True)
