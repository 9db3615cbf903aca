"""Faults injected through the runner: a raising step fails only its requests, a hung step is
caught by the watchdog, and the engine reports what happened. Runs on asyncio and trio."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.actors.engine import EngineStopped
from troupe.actors.watchdog import ExecutorHung
from troupe.config import ConfigError
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner
from troupe.gpu.model_config import ModelLoadError
from troupe.messages import Failed, Finished

pytestmark = pytest.mark.anyio

CONFIG = EngineConfig(runner="fake", num_kv_blocks=256, num_cpu_blocks=16)
PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


async def test_a_raising_step_fails_only_its_requests() -> None:
    runner = FaultyRunner(FakeRunner.from_config(CONFIG), fail_at_steps={2})
    first: list = []
    async with Engine.open(CONFIG, runner=runner) as engine:
        runner.hold_after(1)  # step 2 (the one that raises) waits until the second request is in
        async with anyio.create_task_group() as tg:

            async def run_first() -> None:
                first.extend(await collect(engine, [11, 12, 13], PARAMS))

            tg.start_soon(run_first)
            await anyio.to_thread.run_sync(runner.wait_until_held)
            tg.start_soon(_finishes, engine, [21, 22])
            while engine.num_active < 2:
                await anyio.sleep(0.01)
            runner.release()
        event = terminal(first)
        assert isinstance(event, Failed), event
        assert "fault injected at step 2" in event.message
        assert len(token_ids(first)) == 1  # step 1's token streamed before the fault
        await _finishes(engine, [31, 32, 33])  # the engine still serves
        assert engine.is_healthy
        await wait_blocks_free(engine)


async def test_non_finite_logits_fail_only_that_request() -> None:
    # Step 1 (a's prefill) is held until b and c are in: step 2 runs a's decode with their
    # prefills, and step 3, where a's logits come out NaN, decodes all three.
    runner = FaultyRunner(FakeRunner.from_config(CONFIG), nan_at={3: {"a"}})
    results: dict[str, list] = {}
    prompts = {"a": [11, 12, 13], "b": [21, 22], "c": [31, 32, 33, 34]}
    async with Engine.open(CONFIG, runner=runner) as engine:
        runner.hold_after(0)
        async with anyio.create_task_group() as tg:

            async def run(rid: str) -> None:
                results[rid] = await collect(engine, prompts[rid], PARAMS, request_id=rid)

            tg.start_soon(run, "a")
            await anyio.to_thread.run_sync(runner.wait_until_held)
            tg.start_soon(run, "b")
            tg.start_soon(run, "c")
            while engine.num_active < 3:
                await anyio.sleep(0.01)
            runner.release()
        event = terminal(results["a"])
        assert isinstance(event, Failed), event
        assert re.fullmatch(r"non-finite logits at step \d+", event.message), event.message
        # the tokens of steps 1 and 2 streamed before the fault, and they are the right ones
        assert token_ids(results["a"]) == FakeRunner.reference_tokens(prompts["a"], 2, PARAMS)
        for rid in ("b", "c"):
            assert isinstance(terminal(results[rid]), Finished)
            assert token_ids(results[rid]) == FakeRunner.reference_tokens(prompts[rid], 6, PARAMS)
        await wait_blocks_free(engine)
        assert engine.stats().num_gpu_blocks_used == 0
        await _finishes(engine, [41, 42, 43])  # the engine still serves
        assert engine.is_healthy


async def _finishes(engine: Engine, prompt: list[int]) -> None:
    events = await collect(engine, prompt, PARAMS)
    assert isinstance(terminal(events), Finished)
    assert token_ids(events) == FakeRunner.reference_tokens(prompt, 6, PARAMS)


async def test_a_hung_step_is_caught_by_the_watchdog() -> None:
    config = CONFIG.replace(step_timeout_s=1.0)
    runner = FaultyRunner(FakeRunner.from_config(config), hang_at_step=3)
    seen: dict = {}
    try:
        with pytest.raises(EngineStopped, match="step_timeout_s") as info:  # raised on leaving
            async with Engine.open(config, runner=runner) as engine:
                with anyio.fail_after(60):  # a hang detector only; the watchdog fires in ~1 s
                    seen["events"] = await collect(engine, [5, 6, 7], PARAMS)
                seen["healthy"] = engine.is_healthy
                seen["late"] = await collect(engine, [1, 2], PARAMS)
        assert isinstance(info.value.__cause__, ExecutorHung)
    finally:
        runner.release()  # let the abandoned worker thread end
    event = terminal(seen["events"])
    assert isinstance(event, Failed) and "step_timeout_s" in event.message
    assert len(token_ids(seen["events"])) <= 2  # steps 1 and 2 ran (unless the machine is slow)
    assert seen["healthy"] is False
    assert terminal(seen["late"]).finish_reason is not None  # refused, not hung


async def test_an_actor_crash_fails_open_requests_and_is_reported() -> None:
    runner = FaultyRunner(FakeRunner.from_config(CONFIG))
    heard: list = []  # what metrics see: the crash's Failed too
    results: list = []
    healthy = []
    with pytest.raises(EngineStopped) as info:  # raised on leaving: check the rest after it
        async with Engine.open(CONFIG, runner=runner) as engine:
            engine.add_event_listener(lambda event, now: heard.append(event))
            runner.hold_after(1)
            async with anyio.create_task_group() as tg:

                async def run() -> None:
                    results.extend(await collect(engine, [9, 8, 7], PARAMS))

                tg.start_soon(run)
                await anyio.to_thread.run_sync(runner.wait_until_held)
                # Break the graph itself (not one request): the allocator's core is corrupted.
                allocator = next(a for a in engine._actors if a.name == "allocator")
                allocator.core.handle = None  # type: ignore[method-assign]
                runner.release()
            healthy.append(engine.is_healthy)
    assert isinstance(info.value.__cause__, TypeError)
    event = terminal(results)
    assert isinstance(event, Failed) and "engine failure" in event.message
    assert heard[-1] == event and healthy == [False]


async def test_open_raises_the_load_error_itself(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        async with Engine.open(CONFIG.replace(runner="model", model="/no/such/model")):
            pass
    folder = tmp_path / "gpt2-like"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 100,
                "intermediate_size": 128,
            }
        )
    )
    with pytest.raises(ModelLoadError, match="model_type 'gpt2' is not supported"):
        async with Engine.open(EngineConfig(model=str(folder), device="cpu")):
            pass


class _ClosingSpy(FaultyRunner):
    def __init__(self) -> None:
        super().__init__(FakeRunner.from_config(CONFIG))
        self.num_closed = 0

    def close(self) -> None:
        self.num_closed += 1
        super().close()


async def test_a_start_that_fails_while_wiring_closes_the_runner(tmp_path: Path) -> None:
    """The runner (on a GPU: the model and its KV pool) is closed when the start fails after
    it loaded, here at the trace file, so an app that tries again has its memory back."""
    runner = _ClosingSpy()
    config = CONFIG.replace(trace_path=str(tmp_path / "no-such-folder" / "run.trace"))
    with pytest.raises(FileNotFoundError):
        async with Engine.open(config, runner=runner):
            pass
    assert runner.num_closed == 1


def test_step_timeout_is_validated() -> None:
    with pytest.raises(ConfigError, match="step_timeout_s"):
        EngineConfig(step_timeout_s=0)
