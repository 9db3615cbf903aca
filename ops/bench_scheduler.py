"""Scheduler + allocator CPU time per step, driven synchronously with the fake runner.

    troupe bench scheduler [--num-seqs 256]

256 requests with 1,000-token prompts are prefilled, then decode together; the benchmark reports
the median milliseconds per step spent in SchedulerCore.handle and AllocatorCore.handle (the
fake runner's time is excluded). Target: <= 0.45 ms at 256 sequences.

`CoreLoop` is also the synchronous driver the scheduler tests use: it wires the two cores and
a FakeRunner with no event loop, in the order the actor graph would deliver messages.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.speculator import SpecSettings
from troupe.actors.core.step_limits import StepLimits
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import (
    AdmittedRequest,
    AllocationResult,
    FinishReason,
    SamplingParams,
    StepPlan,
    StepResult,
    TokenBatch,
)
from troupe.messages.engine_calls import UpdateWeights, WeightsLoaded

TARGET_MS = 0.45  # issue 8


class CoreLoop:
    """Scheduler, allocator and fake runner wired synchronously.

    `run()` delivers the scheduler's inbox in batches until nothing is left; `inject` maps a
    delivery number to extra messages (arrivals, aborts) added to that batch, so tests can land
    them in any phase of a step.
    """

    def __init__(
        self,
        scheduler: SchedulerCore,
        allocator: AllocatorCore,
        runner: FakeRunner,
        *,
        check: Callable[[AllocatorCore], None] | None = None,
        keep_messages: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.allocator = allocator
        self.runner = runner
        self.check = check  # asserts allocator invariants after every batch (tests)
        # Every plan and batch, for tests to inspect. The benchmark keeps none: ~500 tracked
        # tuples a step kept alive make the garbage collector run inside the timed calls
        # about once a step, a cost of this harness that the engine (which drops each
        # message once delivered) does not have.
        self.keep_messages = keep_messages
        self.batches: list[TokenBatch] = []
        self.plans: list[StepPlan] = []
        self.plan_sizes: list[tuple[int, int]] = []  # per StepPlan: (sequences, tokens)
        self.num_plans = 0
        self.tokens: dict[str, list[int]] = defaultdict(list)
        self.finished: dict[str, list[tuple[FinishReason, str | None]]] = defaultdict(list)
        self.scheduler_s: list[float] = []  # per StepPlan: scheduler + allocator seconds
        self.num_refused = 0  # ops the allocator refused (the scheduler planned too much)
        self.replies: list[Any] = []  # answers to the engine's calls (messages/engine_calls.py)
        self._inbox: list[Any] = []  # SchedulerInbox messages
        self._num_deliveries = 0

    def submit(self, msgs: Iterable[msgspec.Struct]) -> None:
        self._inbox.extend(msgs)

    def run(
        self, inject: Mapping[int, list[msgspec.Struct]] | None = None, max_deliveries: int = 10**6
    ) -> None:
        pending = dict(inject or {})
        core_s = 0.0
        while self._num_deliveries < max_deliveries:
            extra = pending.pop(self._num_deliveries, [])
            if not self._inbox and not extra:
                if not pending:
                    return
                self._num_deliveries = min(pending)
                continue
            batch, self._inbox = [*self._inbox, *extra], []
            self._num_deliveries += 1
            t0 = time.perf_counter()
            out = self.scheduler.handle(batch)
            core_s += time.perf_counter() - t0
            for dest, msg in out:
                if dest == "allocator":
                    t0 = time.perf_counter()
                    answers = self.allocator.handle([msg])  # type: ignore[list-item]
                    core_s += time.perf_counter() - t0
                    if self.check is not None:
                        self.check(self.allocator)
                    for _, answer in answers:
                        assert isinstance(answer, AllocationResult)
                        self.num_refused += len(answer.refused)
                    self._inbox.extend(m for _, m in answers)
                elif dest == "executor" and isinstance(msg, UpdateWeights):
                    self._inbox.append(WeightsLoaded(call_id=msg.call_id, message="loaded"))
                elif dest == "executor":
                    assert isinstance(msg, StepPlan)
                    self.num_plans += 1
                    self.plan_sizes.append((len(msg.seqs), msg.num_tokens))
                    if self.keep_messages:
                        self.plans.append(msg)
                    self.scheduler_s.append(core_s)
                    core_s = 0.0
                    sampled = self.runner.execute(msg)
                    self._inbox.append(
                        StepResult(step_id=msg.step_id, time=float(self.num_plans), sampled=sampled)
                    )
                elif dest == "streamer":
                    assert isinstance(msg, TokenBatch)
                    self._record(msg)
                elif dest == "engine":
                    self.replies.append(msg)
                else:
                    raise AssertionError(f"unexpected outbox {dest!r}")
        raise AssertionError(f"no quiescence after {max_deliveries} deliveries")

    def _record(self, batch: TokenBatch) -> None:
        if self.keep_messages:
            self.batches.append(batch)
        for out in batch.outputs:
            assert not self.finished[out.request_id], f"{out.request_id} output after its end"
            self.tokens[out.request_id].extend(out.token_ids)
            if out.finish_reason is not None:
                self.finished[out.request_id].append((out.finish_reason, out.error))


def build_loop(
    *,
    block_size: int = 16,
    num_gpu_blocks: int = 4096,
    num_cpu_blocks: int = 1024,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 4096,
    enable_prefix_caching: bool = True,
    preemption_mode: str = "auto",
    scheduling_policy: str = "priority",
    max_chunk_tokens: int = 0,
    check: Callable[[AllocatorCore], None] | None = None,
    speculative: SpecSettings | None = None,
    cpu_prefix_tier: bool = False,
    num_lookahead_tokens: int = 0,
    hold_last_prompt_token: bool = False,
) -> CoreLoop:
    """Cores and a fake runner sized alike."""
    scheduler = SchedulerCore(
        StepLimits(
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching,
            num_lookahead_tokens=num_lookahead_tokens,
            max_chunk_tokens=max_chunk_tokens,
        ),
        num_cpu_blocks=num_cpu_blocks,
        preemption_mode=preemption_mode,
        scheduling_policy=scheduling_policy,
        eos_token_ids=(2,),
        speculative=speculative,
        hold_last_prompt_token=hold_last_prompt_token,
    )
    allocator = AllocatorCore(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        enable_prefix_caching=enable_prefix_caching,
        cpu_prefix_tier=cpu_prefix_tier,
    )
    runner = FakeRunner(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        max_model_len=65536,
    )
    return CoreLoop(scheduler, allocator, runner, check=check)


def measure(num_seqs: int = 256, prompt_len: int = 1000, num_decode: int = 64) -> dict[str, float]:
    """Median scheduler + allocator ms per decode step with `num_seqs` running sequences."""
    blocks_per_seq = -(-(prompt_len + num_decode) // 16)
    loop = build_loop(
        num_gpu_blocks=num_seqs * blocks_per_seq + 64,
        max_num_seqs=num_seqs,
        max_num_batched_tokens=max(16384, num_seqs),  # prefill fast, then measure decodes
    )
    loop.keep_messages = False
    params = SamplingParams(max_tokens=num_decode, ignore_eos=True, temperature=0.0)
    loop.submit(
        AdmittedRequest(
            request_id=f"r{i}",
            prompt_token_ids=tuple(100 + (i * 7 + j) % 20000 for j in range(prompt_len)),
            params=params,
            arrival_time=0.0,
            max_total_tokens=prompt_len + num_decode,
        )
        for i in range(num_seqs)
    )
    loop.run()
    decode = [
        s
        for s, (num_rows, num_tokens) in zip(loop.scheduler_s, loop.plan_sizes, strict=True)
        if num_rows == num_seqs and num_tokens == num_seqs
    ]
    return {
        "num_seqs": num_seqs,
        "decode_steps": len(decode),
        "median_ms": 1000 * statistics.median(decode),
        "p90_ms": 1000 * sorted(decode)[int(0.9 * (len(decode) - 1))],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=256)
    num_seqs = parser.parse_args(argv).num_seqs
    row = measure(num_seqs)
    verdict = "ok" if row["median_ms"] <= TARGET_MS else f"over the {TARGET_MS} ms target"
    print(
        f"scheduler+allocator: {row['median_ms']:.3f} ms/step median, {row['p90_ms']:.3f} ms p90 "
        f"over {row['decode_steps']} decode steps at {num_seqs} running sequences, 1000-token "
        f"contexts ({verdict})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
