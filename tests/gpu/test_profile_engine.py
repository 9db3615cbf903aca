"""The profiler on the real runner (actors/core/executor_profile.py through Engine): a tiny
random Qwen3 folder, the runner in the executor's thread; the trace of a profile around one
request holds the model's ops run in that thread (on the CPU the aten ops; on CUDA the
kernels too), and the engine goes on serving after it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest
from troupe import Engine, EngineConfig
from troupe.messages import SamplingParams

from tests.gpu.conftest import add_word_tokenizer

PROMPT = [(5 * j + 1) % 256 for j in range(17)]
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_a_profile_holds_the_steps_it_spans(
    device: str, tmp_path: Path, mt: SimpleNamespace
) -> None:
    folder = tmp_path / "model"
    mt.make_hf_model("qwen3").save_pretrained(folder)
    add_word_tokenizer(folder)
    config = EngineConfig(
        device=device,  # type: ignore[arg-type]
        model=str(folder),
        dtype="float32",
        block_size=4,
        num_kv_blocks=64,
        max_num_seqs=4,
        max_model_len=128,
        profiler_dir=str(tmp_path / "traces"),
    )
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

    async def main() -> tuple[Path, list[int], list[int]]:
        async with Engine.open(config) as engine:
            started = await engine.start_profile()
            assert started.error is None, started
            profiled = [t async for e in engine.generate(PROMPT, params) for t in e.token_ids]
            stopped = await engine.stop_profile()
            assert stopped.error is None and stopped.trace_path is not None, stopped
            after = [t async for e in engine.generate(PROMPT, params) for t in e.token_ids]
            return Path(stopped.trace_path), profiled, after

    path, profiled, after = anyio.run(main)
    assert profiled == after and len(profiled) == 6  # profiling changes no token
    events = json.loads(path.read_text())["traceEvents"]
    names = {str(e.get("name")) for e in events}
    assert any(n.startswith("aten::") for n in names), sorted(names)[:20]
    if device == "cuda":
        assert any(e.get("cat") == "kernel" for e in events), "no CUDA kernel recorded"
