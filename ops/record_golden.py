"""Re-record the golden traces in tests/fixtures/traces (fake runner, no model).

    python -m troupe.ops.record_golden [OUT_DIR]

Run it when a message format or a core's policy changes on purpose, and commit the result.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

import anyio
from troupe import Engine, EngineConfig, SamplingParams

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "traces"


async def _drain(engine: Engine, prompt: object, params: object) -> None:
    async for _ in engine.generate(prompt, params):  # type: ignore[arg-type]
        pass


async def _wait_idle(engine: Engine) -> None:
    with anyio.fail_after(10):
        while engine.stats().num_gpu_blocks_used or engine.num_active:
            await anyio.sleep(0.01)


async def mixed(path: Path) -> None:
    """Text, chat and token-id prompts, stop strings, and two rejections."""
    config = EngineConfig(
        runner="fake",
        num_kv_blocks=128,
        num_cpu_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=48,
        trace_path=str(path),
    )
    async with Engine.open(config) as engine:
        async with anyio.create_task_group() as tg:
            for i in range(6):
                prompt = [200 + i] * (3 + 11 * i)
                tg.start_soon(_drain, engine, prompt, SamplingParams(max_tokens=3 + i))
            tg.start_soon(_drain, engine, "The actors take the stage", {"max_tokens": 6})
            tg.start_soon(_drain, engine, [{"role": "user", "content": "hi"}], {"max_tokens": 4})
            tg.start_soon(_drain, engine, "", {"max_tokens": 5})
            tg.start_soon(_drain, engine, "bad", {"top_p": 2.0})
        await _wait_idle(engine)


async def preempt(path: Path, mode: Literal["swap", "recompute"]) -> None:
    """A pool too small for the load, so requests are preempted (swap or recompute)."""
    config = EngineConfig(
        runner="fake",
        num_kv_blocks=12,
        num_cpu_blocks=16,
        block_size=4,
        max_num_seqs=6,
        max_num_batched_tokens=32,
        preemption_mode=mode,
        enable_prefix_caching=False,
        trace_path=str(path),
    )
    async with Engine.open(config) as engine:
        async with anyio.create_task_group() as tg:
            for i in range(6):
                prompt = [300 + i] * (4 + 3 * i)
                tg.start_soon(_drain, engine, prompt, SamplingParams(max_tokens=10, priority=i % 2))
        await _wait_idle(engine)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else DEFAULT_DIR
    out.mkdir(parents=True, exist_ok=True)
    anyio.run(mixed, out / "mixed.trace")
    anyio.run(preempt, out / "preempt-swap.trace", "swap")
    anyio.run(preempt, out / "preempt-recompute.trace", "recompute")
    for path in sorted(out.glob("*.trace")):
        print(f"{path}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
