"""A LoRA adapter over HTTP on the real default model (SmolLM2 on the CPU): a request whose
`model` names the adapter answers what `generate(..., SamplingParams(lora=...))` answers on
the same engine, and not what the base model answers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI
from troupe.config import EngineConfig
from troupe.gateway.state import GatewaySettings
from troupe.messages import SamplingParams

from tests.gateway.conftest import ServerThread
from tests.lora.adapters import SMOLLM2_SHAPES as SHAPES
from tests.lora.adapters import raw_adapter

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name three colours."}]
N = 12


@pytest.fixture(scope="module")
def smol_lora(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """SmolLM2 served with one adapter, `tiny` (random A and B), its engine in a child."""
    # scale 0.06: the greedy text changes within a few tokens (0.02's does not in 12; 0.2's
    # is noise), so "differs from the base model" tells an adapter that runs from one ignored
    folder = raw_adapter(
        tmp_path_factory.mktemp("lora") / "tiny", num_layers=30, shapes=SHAPES, scale=0.06
    )
    config = EngineConfig(
        device="cpu",
        max_model_len=256,
        num_kv_blocks=32,
        max_num_seqs=4,
        lora_modules=(f"tiny={folder}",),
    )
    srv = ServerThread(config, GatewaySettings()).start()
    yield srv
    srv.shutdown()


def _engine_text(srv: ServerThread, prompt: Any, lora: str | None) -> str:
    """What the engine itself answers, greedy, with or without the adapter."""

    async def run() -> str:
        params = SamplingParams(max_tokens=N, temperature=0.0, lora=lora)
        return "".join([e.text async for e in srv.engine.generate(prompt, params)])

    return str(srv.call(run(), timeout=120))


def test_model_naming_the_adapter_runs_it(smol_lora: ServerThread) -> None:
    client = OpenAI(base_url=f"{smol_lora.url}/v1", api_key="unused", max_retries=0, timeout=120)
    base = smol_lora.engine.model_name
    assert [m.id for m in client.models.list().data] == [base, "tiny"]

    def completion(model: str) -> str:
        out = client.completions.create(model=model, prompt=PROMPT, max_tokens=N, temperature=0)
        assert out.model == model
        return out.choices[0].text

    def chat(model: str) -> str:
        out = client.chat.completions.create(
            model=model,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=N,
            temperature=0,
        )
        return str(out.choices[0].message.content)

    on_adapter, on_base = completion("tiny"), completion(base)
    assert on_adapter == _engine_text(smol_lora, PROMPT, "tiny")
    assert on_base == _engine_text(smol_lora, PROMPT, None)
    assert on_adapter != on_base, "the adapter changed nothing: is `lora` ignored?"
    chat_adapter = chat("tiny")
    assert chat_adapter == _engine_text(smol_lora, MESSAGES, "tiny")
    assert chat_adapter != chat(base)
