"""The burst step timeline (ops/burst_steps.py): the TimedRunner sees every step the engine runs,
and the summary's arithmetic."""

from __future__ import annotations

import random

import anyio
import pytest
from troupe import Engine, EngineConfig, SamplingParams
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.timed_runner import StepTime, TimedRunner
from troupe.ops.burst_steps import by_batch, main, summarize


@pytest.mark.anyio
async def test_the_timed_runner_sees_every_token_the_engine_computes() -> None:
    """Without overlap or prefix hits a request's prompt is computed once and each output
    token but the last is fed back once: the steps' tokens add up to exactly that."""
    config = EngineConfig(runner="fake", num_kv_blocks=512, max_num_batched_tokens=256)
    runner = TimedRunner(FakeRunner.from_config(config))
    rng = random.Random(7)
    prompts = [[rng.randrange(100, 30_000) for _ in range(rng.randint(20, 300))] for _ in range(9)]
    outputs = [rng.randint(1, 12) for _ in prompts]
    async with Engine.open(config, runner=runner) as engine:

        async def one(prompt: list[int], n: int) -> None:
            params = SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)
            async for _ in engine.generate(prompt, params):
                pass

        async with anyio.create_task_group() as tg:
            for prompt, n in zip(prompts, outputs, strict=True):
                tg.start_soon(one, prompt, n)
    steps = runner.steps
    assert sum(s.num_tokens for s in steps) == sum(map(len, prompts)) + sum(outputs) - len(outputs)
    assert all(s.num_tokens <= 256 and s.start <= s.end for s in steps)
    assert [s.step_id for s in steps] == sorted(s.step_id for s in steps)
    assert sum(s.num_prefill_seqs for s in steps) >= len(prompts)  # chunks: a prompt in several


def test_summary_splits_the_prefill_phase_from_the_decodes() -> None:
    t0 = 100.0
    steps = [
        StepTime(1, t0 + 0.005, t0 + 0.015, num_seqs=4, num_tokens=400, num_prefill_seqs=4),
        StepTime(2, t0 + 0.016, t0 + 0.026, num_seqs=6, num_tokens=204, num_prefill_seqs=2),
        StepTime(3, t0 + 0.030, t0 + 0.033, num_seqs=6, num_tokens=6, num_prefill_seqs=0),
        StepTime(4, t0 + 0.035, t0 + 0.038, num_seqs=6, num_tokens=6, num_prefill_seqs=0),
        StepTime(5, t0 + 0.040, t0 + 0.043, num_seqs=5, num_tokens=5, num_prefill_seqs=0),
    ]
    lines = summarize(steps, t0, show=2)
    assert lines[0] == "first step: +5.0 ms, 4 sequences, 400 tokens"
    # 400 + (204 - 4 decodes) prompt tokens over 21 ms
    assert lines[1] == "prefill: 2 steps, 21.0 ms, 600 prompt tokens (28.6K/s), 4 decodes carried"
    assert lines[2] == "decode: 3 steps, median period 5.00 ms, median 6 sequences"
    assert lines[3].startswith("  step 1: +    5.0 .. +   15.0 ms (gap   5.0)")
    assert lines[4].startswith("  step 2: +   16.0 .. +   26.0 ms (gap   1.0)")
    assert len(lines) == 5


def test_steps_grouped_by_batch_size() -> None:
    t0 = 10.0
    steps = [
        StepTime(1, t0, t0 + 0.010, num_seqs=20, num_tokens=900, num_prefill_seqs=20),
        StepTime(2, t0 + 0.012, t0 + 0.015, num_seqs=20, num_tokens=20, num_prefill_seqs=0),
        StepTime(3, t0 + 0.016, t0 + 0.020, num_seqs=16, num_tokens=16, num_prefill_seqs=0),
        StepTime(4, t0 + 0.023, t0 + 0.025, num_seqs=3, num_tokens=3, num_prefill_seqs=0),
    ]
    assert by_batch(steps) == [
        "  prefill: 1 steps, in the runner median 10.00 ms, gap median 0.00 ms, total 0 ms",
        "  17-64 seqs: 1 steps, in the runner median 3.00 ms, gap median 2.00 ms, total 2 ms",
        "  1-16 seqs: 2 steps, in the runner median 3.00 ms, gap median 2.00 ms, total 4 ms",
    ]


def test_a_fake_burst_prints_its_timeline(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--runner", "fake", "--num-prompts", "6", "--bursts", "1", "--steps", "3"]
    argv += ["--max-input-len", "200", "--max-output-len", "80"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("burst 1: TTFT min ")
    assert out[1].startswith("first step: +")
    assert out[2].startswith("prefill: ")
    assert sum(line.startswith("  step ") for line in out) == 3
