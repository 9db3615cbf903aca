"""The Python API's default sampling parameters (vLLM's `LLM.get_default_sampling_params`): a
request given no params gets the model's generation_config.json values, max_new_tokens as its
max_tokens (never past max_model_len), through Engine.generate, Engine.submit and
generate_batch; a SamplingParams or a mapping the caller passes is taken as it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from troupe import Engine, EngineConfig, SamplingParams, generate_batch
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import Finished, StreamEvent
from troupe.messages.sampling_defaults import NO_DEFAULTS, SamplingDefaults

from tests.actors.test_generation_defaults import QWEN3, model_folder
from tests.gateway.scripted_runner import ParamsRecorder

FILE = {**QWEN3, "repetition_penalty": 1.05, "max_new_tokens": 3}
# what a request given no params runs with: the file's values, SamplingParams' for the rest
FROM_FILE = SamplingParams(
    temperature=0.6, top_p=0.95, top_k=20, repetition_penalty=1.05, max_tokens=3
)


def _config(folder: Path, **kw: Any) -> EngineConfig:
    return EngineConfig(runner="fake", model=str(folder), num_kv_blocks=64, gc_freeze=False, **kw)


def test_params_are_the_defaults_over_sampling_params_own() -> None:
    assert NO_DEFAULTS.params(2048) == SamplingParams()
    defaults = SamplingDefaults(temperature=0.6, top_k=20, min_p=0.05, max_tokens=512)
    assert defaults.params(2048) == SamplingParams(
        temperature=0.6, top_k=20, min_p=0.05, max_tokens=512
    )
    # max_new_tokens past the context is cut to it, as chat's default max_tokens
    assert defaults.params(128).max_tokens == 128
    assert SamplingDefaults(top_p=0.9).params(8) == SamplingParams(top_p=0.9)


async def _run(engine: Engine, prompt: Any, params: Any = None, **kw: Any) -> list[StreamEvent]:
    return [event async for event in engine.generate(prompt, params, **kw)]


@pytest.mark.anyio
async def test_generate_without_params_runs_the_models_defaults(tmp_path: Path) -> None:
    config = _config(model_folder(tmp_path / "qwen3", FILE))
    runner = ParamsRecorder(FakeRunner.from_config(config))
    async with Engine.open(config, runner=runner) as engine:
        assert engine.default_sampling_params() == FROM_FILE
        events = await _run(engine, [100, 101, 102], request_id="bare")
        assert runner.take() == [FROM_FILE]
        assert isinstance(events[-1], Finished) and events[-1].usage.completion_tokens == 3
        chat = [{"role": "user", "content": "hi"}]
        await _run(engine, chat, request_id="chat")
        assert runner.take() == [FROM_FILE]
        # explicit params are the caller's, whole: no field of the file fills them
        own = SamplingParams(max_tokens=2, temperature=0.0)
        await _run(engine, [100, 101], own, request_id="own")
        assert runner.take() == [own]
        await _run(engine, [100, 101], {"max_tokens": 2}, request_id="mapping")
        assert runner.take() == [SamplingParams(max_tokens=2)]
        # submit, the batch jobs' door, the same
        done = anyio.Event()
        ends: list[StreamEvent] = []

        def on_event(event: StreamEvent) -> None:
            if event.is_terminal:
                ends.append(event)
                done.set()

        await engine.submit([100, 101, 102], None, on_event, request_id="submitted")
        await done.wait()
        assert runner.take() == [FROM_FILE]
        assert isinstance(ends[0], Finished) and ends[0].usage.completion_tokens == 3


@pytest.mark.anyio
async def test_without_a_file_the_defaults_are_sampling_params_own(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "qwen3", FILE)
    config = _config(folder, generation_config="vllm")  # the file ignored
    runner = ParamsRecorder(FakeRunner.from_config(config))
    async with Engine.open(config, runner=runner) as engine:
        assert engine.default_sampling_params() == SamplingParams()
        await _run(engine, [100, 101, 102], request_id="bare")
        assert runner.take() == [SamplingParams()]


def test_generate_batch_without_params_runs_the_models_defaults(tmp_path: Path) -> None:
    config = _config(model_folder(tmp_path / "qwen3", FILE))
    prompts: list[Any] = [[100 + i] * (3 + i) for i in range(4)]
    results = generate_batch(prompts, None, config, progress=False)
    for prompt, out in zip(prompts, results, strict=True):
        assert out.error is None and out.usage is not None
        assert out.usage.completion_tokens == 3  # max_new_tokens, not SamplingParams' 16
        assert out.token_ids == FakeRunner.reference_tokens(prompt, 3, FROM_FILE)
    own = SamplingParams(max_tokens=5)
    (out,) = generate_batch(prompts[:1], own, config, progress=False)
    assert out.usage is not None and out.usage.completion_tokens == 5
