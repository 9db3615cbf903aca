"""A runner that can never step again turns the engine dead: every open request fails once with
"engine dead: <cause>", new ones are refused with it at once, `is_healthy` is False, the pools
are declared gone and the runner is closed. Runs on asyncio and trio."""

from __future__ import annotations

import re

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, token_ids
from troupe import Engine, EngineConfig, SamplingParams
from troupe.actors.engine import EngineStopped
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner, InjectedDeath
from troupe.gpu.runner_dead import RunnerDead
from troupe.messages import Failed, RejectCode, Rejected, SampledToken, StepPlan

pytestmark = pytest.mark.anyio

# max_num_seqs 2 of 4 requests: two run while the others wait when the runner dies
CONFIG = EngineConfig(runner="fake", num_kv_blocks=64, num_cpu_blocks=8, max_num_seqs=2)
PARAMS = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
DEAD = "engine dead: the runner died at step 3 (injected)"


class _ClosedOnce(FaultyRunner):
    num_closed = 0

    def close(self) -> None:
        self.num_closed += 1
        super().close()


async def test_a_dead_runner_fails_every_request_once_and_refuses_new_ones() -> None:
    runner = _ClosedOnce(FakeRunner.from_config(CONFIG), dead_at_step=3)
    results: dict[str, list] = {}
    heard: list = []  # what metrics see
    seen: dict = {}
    with pytest.raises(EngineStopped, match=re.escape(DEAD)) as info:  # raised on leaving Engine.open
        async with Engine.open(CONFIG, runner=runner) as engine:
            engine.add_event_listener(lambda event, now: heard.append(event))
            runner.hold_after(0)  # step 1 waits until all four are in
            with anyio.fail_after(60):  # a hang detector only
                async with anyio.create_task_group() as tg:
                    for name in "abcd":

                        async def run(name: str = name) -> None:
                            prompt = [10 + ord(name) % 10, 7, 8]
                            results[name] = await collect(engine, prompt, PARAMS)

                        tg.start_soon(run)
                    while engine.num_active < 4:
                        await anyio.sleep(0.01)
                    runner.release()
                await engine.wait_stopped()
            seen["healthy"] = engine.is_healthy
            seen["failure"] = engine.failure
            seen["stats"] = engine.stats()
            seen["late"] = await collect(engine, [1, 2, 3], PARAMS)
    assert isinstance(info.value.__cause__, InjectedDeath)
    assert seen["healthy"] is False and seen["failure"] == DEAD
    for events in results.values():
        event = terminal(events)  # exactly one terminal event each, last
        assert isinstance(event, Failed) and event.message == DEAD
    assert sum(len(token_ids(events)) for events in results.values()) <= 4  # steps 1-2 only
    [late] = seen["late"]  # refused at once, naming the cause
    assert isinstance(late, Rejected) and late.code == RejectCode.SHUTTING_DOWN
    assert late.message == DEAD
    ends = [e for e in heard if isinstance(e, Failed | Rejected)]
    assert sorted(type(e).__name__ for e in ends) == ["Failed"] * 4 + ["Rejected"]
    # The pools are declared gone: no pool, no block held, nothing queued; counters kept.
    stats = seen["stats"]
    assert stats.num_steps >= 2 and stats.prefix_cache_query_tokens > 0
    pools = ("num_gpu_blocks", "num_gpu_blocks_used", "num_gpu_blocks_cached", "num_cpu_blocks")
    queues = ("num_cpu_blocks_used", "num_running", "num_waiting", "num_swapped")
    assert {f: getattr(stats, f) for f in pools + queues} == dict.fromkeys(pools + queues, 0)
    assert runner.num_closed == 1


class _CudaFault(FaultyRunner):
    """Raises what torch raises after an illegal memory access, at step 2."""

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        if self.num_steps == 1:
            raise torch.AcceleratorError(
                "CUDA error: an illegal memory access was encountered\n"
                "CUDA kernel errors might be asynchronously reported at some other API call"
            )
        return super().execute(plan)


async def test_a_poisoned_cuda_context_turns_the_engine_dead() -> None:
    runner = _CudaFault(FakeRunner.from_config(CONFIG))
    seen: dict = {}
    with pytest.raises(EngineStopped) as info:
        async with Engine.open(CONFIG, runner=runner) as engine:
            with anyio.fail_after(60):
                seen["events"] = await collect(engine, [5, 6, 7], PARAMS)
                await engine.wait_stopped()
            seen["healthy"] = engine.is_healthy
    assert isinstance(info.value.__cause__, RunnerDead)
    expected = (
        "engine dead: the CUDA context is lost: AcceleratorError: "
        "CUDA error: an illegal memory access was encountered"
    )
    event = terminal(seen["events"])
    assert isinstance(event, Failed) and event.message == expected
    assert seen["healthy"] is False
