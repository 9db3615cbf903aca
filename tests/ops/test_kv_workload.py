"""ops/kv_workload.py (the loop of fp8_kv_bench's workload) through the fake runner: every
request gets exactly its tokens, as a correct cache gives them, in the waves the pool allows."""

from __future__ import annotations

import pytest
from troupe.gpu.fake_runner import FakeRunner
from troupe.ops.kv_workload import run_workload, summary_lines


def _prompt(seq: int, length: int) -> list[int]:
    return [(7 * seq + 13 * i) % 100_000 + 10 for i in range(length)]


@pytest.mark.parametrize(("max_running", "peak"), [(None, 4), (2, 2)])
def test_each_request_gets_the_tokens_a_correct_cache_gives(
    max_running: int | None, peak: int
) -> None:
    # 40 + 9 tokens need 4 blocks of 16: a pool of 16 runs 4 at once, 6 requests in two waves
    runner = FakeRunner(block_size=16, num_gpu_blocks=16, num_cpu_blocks=4, max_model_len=64)
    result = run_workload(
        runner, num_blocks=16, block_size=16, num_seqs=6, prompt_len=40, output_len=9,
        budget=24, max_running=max_running, timed=True,
    )  # fmt: skip
    assert result.peak_running == peak
    for seq, out in enumerate(result.outputs):
        assert out == FakeRunner.reference_tokens(_prompt(seq, 40), 9), seq
    assert runner.num_live == 0  # every request released
    # the timeline: every computed token once (prompts, and outputs fed back but the last)
    steps = result.steps
    assert sum(s.num_tokens for s in steps) == 6 * 40 + 6 * 8
    assert all(s.num_tokens <= 24 for s in steps)
    lines = summary_lines(result)
    assert lines[0].startswith(f"  {len(steps)} steps; inside execute")
    (prefill_line,) = [line for line in lines if line.startswith("  steps with prefill:")]
    first = next(s for s in steps if s.num_prefill_seqs)  # a cold first step shows apart
    assert f"; the first {1e3 * (first.end - first.start):.1f} ms, median " in prefill_line
    # the decodes of the widest steps: one bucket of exactly `peak` sequences (4-4 or 2-2)
    assert any(line.startswith(f"  decode steps of {peak}-{peak} sequences: ") for line in lines), (
        lines
    )


def test_a_request_bigger_than_the_pool_is_refused() -> None:
    runner = FakeRunner(block_size=16, num_gpu_blocks=2, num_cpu_blocks=1, max_model_len=64)
    with pytest.raises(ValueError, match="needs 4 blocks, the pool has 2"):
        run_workload(
            runner, num_blocks=2, block_size=16, num_seqs=1, prompt_len=40, output_len=9,
            budget=24,
        )  # fmt: skip
