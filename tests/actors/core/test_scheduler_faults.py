"""Faults around the scheduler core, driven through the real scheduler, allocator and executor
cores with a fake runner: a sequence whose logits come out non-finite fails alone, with the
reason and the step, and so does an admitted request that makes the scheduler raise; the others
finish with the tokens they get without the fault, and every block returns to the pool."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

import msgspec
import pytest
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.executor import ExecutorCore
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.step_limits import StepLimits
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner
from troupe.gpu.runner import Runner
from troupe.messages import (
    AdmittedRequest,
    FailedSeq,
    FinishReason,
    SamplingParams,
    SeqFailureReason,
    SeqOutput,
    StepPlan,
    StepResult,
    TokenBatch,
)

BS = 4
MAX_TOKENS = 6
PROMPTS = {"a": (11, 12, 13, 14, 15), "b": (21, 22, 23, 24, 25, 26), "c": (31, 32, 33)}


class Loop:
    """The scheduler's neighbours answered synchronously, each through its own core."""

    def __init__(self, runner: Runner) -> None:
        self.scheduler = SchedulerCore(
            StepLimits(block_size=BS, num_gpu_blocks=32, max_num_seqs=8, max_num_batched_tokens=64),
            num_cpu_blocks=8,
            eos_token_ids=[2],
        )
        self.allocator = AllocatorCore(block_size=BS, num_gpu_blocks=32, num_cpu_blocks=8)
        self.executor = ExecutorCore(runner, clock=lambda: 1.0)
        self.plans: list[StepPlan] = []
        self.results: list[StepResult] = []
        self.outputs: dict[str, list[SeqOutput]] = defaultdict(list)

    def run(self, msgs: Iterable[msgspec.Struct]) -> None:
        """Deliver `msgs`, then every answer, until the scheduler goes idle."""
        inbox = list(msgs)
        while inbox:
            out, inbox = self.scheduler.handle(inbox), []
            for dest, msg in out:
                if dest == "allocator":
                    answers = self.allocator.handle([msg])  # type: ignore[list-item]
                elif dest == "executor":
                    assert isinstance(msg, StepPlan)
                    self.plans.append(msg)
                    answers = self.executor.handle([msg])  # type: ignore[list-item]
                    self.results.extend(m for _, m in answers)  # type: ignore[misc]
                else:
                    assert dest == "streamer" and isinstance(msg, TokenBatch)
                    for output in msg.outputs:
                        self.outputs[output.request_id].append(output)
                    answers = []
                inbox.extend(m for _, m in answers)

    def tokens(self, rid: str) -> list[int]:
        return [t for o in self.outputs[rid] for t in o.token_ids]

    def ending(self, rid: str) -> tuple[FinishReason | None, str | None]:
        """The request's one terminal output (asserted: exactly one, and last)."""
        ends = [o for o in self.outputs[rid] if o.finish_reason is not None]
        assert len(ends) == 1 and ends[0] is self.outputs[rid][-1], self.outputs[rid]
        return ends[0].finish_reason, ends[0].error

    def assert_all_blocks_back(self) -> None:
        stats = self.scheduler.stats()
        assert stats.num_gpu_blocks_used == 0 and stats.num_cpu_blocks_used == 0
        assert self.allocator.seqs == {} and not self.scheduler.requests
        assert self.allocator.gpu.num_free == 32  # cached or free, owned by nobody


def admitted(rid: str, prompt: tuple[int, ...], params: SamplingParams) -> AdmittedRequest:
    return AdmittedRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        params=params,
        arrival_time=0.0,
        max_total_tokens=len(prompt) + params.max_tokens,
    )


def requests() -> list[AdmittedRequest]:
    params = SamplingParams(max_tokens=MAX_TOKENS)
    return [admitted(rid, prompt, params) for rid, prompt in PROMPTS.items()]


def reference(rid: str, n: int = MAX_TOKENS) -> list[int]:
    return FakeRunner.reference_tokens(PROMPTS[rid], n)


def fake_runner() -> FakeRunner:
    return FakeRunner(block_size=BS, num_gpu_blocks=32, num_cpu_blocks=8)


def test_non_finite_logits_fail_one_request_the_others_finish() -> None:
    # Step 1 prefills all three; b's logits are NaN at step 3 (its third token).
    loop = Loop(FaultyRunner(fake_runner(), nan_at={3: {"b"}}))
    loop.run(requests())
    nan = SeqFailureReason.NON_FINITE_LOGITS
    assert loop.results[2].failed == (FailedSeq("b", nan),)
    assert [s.request_id for s in loop.results[2].sampled] == ["a", "c"]
    assert loop.ending("b") == (FinishReason.ERROR, "non-finite logits at step 3")
    assert loop.tokens("b") == reference("b", 2)
    for rid in ("a", "c"):
        assert loop.ending(rid) == (FinishReason.LENGTH, None)
        assert loop.tokens(rid) == reference(rid)
    assert loop.plans[3].released == ("b",)  # the runner drops its state at the next step
    loop.assert_all_blocks_back()


def test_the_same_run_without_the_fault_is_the_reference() -> None:
    loop = Loop(fake_runner())
    loop.run(requests())
    assert all(not r.failed for r in loop.results)
    for rid in PROMPTS:
        assert loop.ending(rid) == (FinishReason.LENGTH, None)
        assert loop.tokens(rid) == reference(rid)
    loop.assert_all_blocks_back()


def _no_params(rid: str) -> AdmittedRequest:
    """Params missing altogether: Request.admit raises before anything is recorded."""
    return AdmittedRequest(
        request_id=rid,
        prompt_token_ids=(41, 42),
        params=None,  # type: ignore[arg-type]
        arrival_time=0.0,
        max_total_tokens=8,
    )


def _text_priority(rid: str) -> AdmittedRequest:
    """A priority of the wrong type: it raises while being sorted into the waiting queue, after
    the request was recorded by id (the cleanup must undo that)."""
    return admitted(rid, (41, 42), SamplingParams(priority="high"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make_bad", "error"),
    [
        (_no_params, "AttributeError: 'NoneType' object has no attribute 'ignore_eos'"),
        (_text_priority, "TypeError: '<' not supported between instances of"),
    ],
    ids=["no-params", "text-priority"],
)
def test_a_request_that_makes_the_scheduler_raise_fails_alone(
    make_bad: Callable[[str], AdmittedRequest], error: str
) -> None:
    loop = Loop(fake_runner())
    a, b, c = requests()
    loop.run([a, make_bad("bad"), b, c])  # "a" is queued first, so "bad" is compared with it
    reason, message = loop.ending("bad")
    assert reason == FinishReason.ERROR and message is not None
    assert message.startswith(f"scheduler failed on this request: {error}"), message
    assert loop.tokens("bad") == []
    for rid in PROMPTS:
        assert loop.ending(rid) == (FinishReason.LENGTH, None)
        assert loop.tokens(rid) == reference(rid)
    assert all(w.request_id != "bad" for p in loop.plans for w in p.seqs)
    loop.assert_all_blocks_back()
    # The scheduler goes on serving.
    loop.run([admitted("later", (51, 52, 53), SamplingParams(max_tokens=3))])
    assert loop.ending("later") == (FinishReason.LENGTH, None)
    assert loop.tokens("later") == FakeRunner.reference_tokens((51, 52, 53), 3)
    loop.assert_all_blocks_back()


def test_a_raising_duplicate_leaves_the_live_request_alone() -> None:
    loop = Loop(fake_runner())
    a, b, c = requests()
    twin = AdmittedRequest(
        request_id="a",
        prompt_token_ids=(1, 2),
        params=SamplingParams(),
        arrival_time="soon",  # type: ignore[arg-type]
        max_total_tokens=8,
    )
    loop.run([a, twin, b, c])
    for rid in PROMPTS:  # "a" got exactly one ending, its own
        assert loop.ending(rid) == (FinishReason.LENGTH, None)
        assert loop.tokens(rid) == reference(rid)
    loop.assert_all_blocks_back()
