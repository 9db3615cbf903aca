"""StreamingLLM through the whole engine (CPU, a tiny random Llama): the engine default turns
it on, a request past max_model_len finishes at its own max_tokens, an opted-out request stops
at max_model_len, one past streaming_max_len is rejected naming the field and the limit, and
a window wider than the pool fails naming it, and an abort mid-stream ends with one terminal
event and every block back."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig
from troupe.actors.core.admission import AdmissionCore, StreamingDefaults
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.weights import random_weights
from troupe.messages import (
    Aborted,
    Finished,
    RequestRejected,
    SamplingParams,
    StreamEvent,
    TokenizedRequest,
)
from troupe.messages.common import FinishReason

from tests.gpu.conftest import FAMILIES, TINY, add_word_tokenizer


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    from safetensors.torch import save_file

    hf = {**TINY, **FAMILIES["llama"], "model_type": "llama", "max_position_embeddings": 128}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    weights = random_weights(ModelConfig.from_hf_dict(hf), torch.float32, seed=1, std=0.2)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp_path / "model.safetensors"))
    add_word_tokenizer(tmp_path)
    return tmp_path


def _config(folder: Path) -> EngineConfig:
    return EngineConfig(
        model=str(folder),
        device="cpu",
        max_model_len=48,
        block_size=4,
        num_kv_blocks=16,
        max_num_batched_tokens=16,
        streaming_window=12,
        sink_tokens=4,
        streaming_max_len=400,
    )


def test_engine_streams_past_max_model_len(folder: Path) -> None:
    prompt = [(3 * j) % 256 for j in range(10)]

    async def main() -> None:
        async with Engine.open(_config(folder)) as engine:
            greedy = {"temperature": 0.0, "ignore_eos": True}
            long = await collect(engine, prompt, SamplingParams(max_tokens=200, **greedy))
            assert isinstance(terminal(long), Finished)
            assert terminal(long).finish_reason == FinishReason.LENGTH  # type: ignore[union-attr]
            assert len(token_ids(long)) == 200  # 210 tokens in a 64-token pool
            off = SamplingParams(max_tokens=200, streaming_window=0, **greedy)
            capped = await collect(engine, prompt, off)
            assert len(token_ids(capped)) == 48 - len(prompt)  # max_model_len holds it
            too_long = await collect(engine, prompt, SamplingParams(max_tokens=391, **greedy))
            rejected = terminal(too_long)
            assert not isinstance(rejected, Finished)
            assert "streaming_max_len = 400" in str(rejected)
            assert "max_tokens" in str(rejected)
            wide = SamplingParams(max_tokens=300, streaming_window=100, **greedy)
            failed = await collect(engine, prompt, wide)  # refused before any token
            assert len(failed) == 1 and "streaming_window 100" in str(failed[0])
            assert "num_kv_blocks" in str(failed[0])
            # abort mid-stream: one terminal event (Aborted), every block back
            events: list[StreamEvent] = []
            ended = anyio.Event()

            def on_event(event: StreamEvent) -> None:
                events.append(event)
                if event.is_terminal:
                    ended.set()

            params = SamplingParams(max_tokens=390, **greedy)
            rid = await engine.submit(prompt, params, on_event)
            with anyio.fail_after(60):
                while len(token_ids(events)) < 60:
                    await anyio.sleep(0.01)
                await engine.abort(rid)
                await ended.wait()
            assert [e.is_terminal for e in events].count(True) == 1
            assert isinstance(events[-1], Aborted)
            await wait_blocks_free(engine, timeout=30)

    anyio.run(main)


def test_admission_refuses_streaming_without_support() -> None:
    """A runner without the sink clause (CUDA kernels, windowed or MLA models): the request is
    rejected naming streaming_window; n > 1 with a window names n."""
    core = AdmissionCore(
        max_model_len=64, vocab_size=256, max_num_seqs=4, max_queued_requests=4,
        max_queued_tokens=1000, streaming=StreamingDefaults(window=0, sink_tokens=4, max_len=0),
    )  # fmt: skip

    def admit(params: SamplingParams) -> object:
        msg = TokenizedRequest(
            request_id="r", prompt_token_ids=(1, 2, 3), params=params, arrival_time=0.0
        )
        ((_, out),) = core.handle([msg])
        return out

    out = admit(SamplingParams(streaming_window=8))
    assert isinstance(out, RequestRejected) and out.field == "streaming_window"
    out = admit(SamplingParams(streaming_window=8, n=2))
    assert isinstance(out, RequestRejected) and out.field == "n"
    assert not isinstance(admit(SamplingParams(max_tokens=500)), RequestRejected)  # capped


def test_runner_streams_only_where_the_sink_clause_exists() -> None:
    """The runner's max_stream_len: the config's on the CPU for a plain model; 0 on CUDA, for a
    windowed model, with a draft model or tensor parallelism (admission then refuses)."""
    from troupe.gpu.runner_setup import max_stream_len

    plain = ModelConfig.from_hf_dict({**TINY, "model_type": "llama"})
    windowed = ModelConfig.from_hf_dict({**TINY, "model_type": "mistral", "sliding_window": 8})
    config = EngineConfig(streaming_max_len=1000)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert max_stream_len(config, cpu, plain) == 1000
    assert max_stream_len(config, cuda, plain) == 0
    assert max_stream_len(config, cpu, windowed) == 0
    assert max_stream_len(config.replace(tensor_parallel_size=2), cpu, plain) == 0
