"""The scheduler's side of late tokens (prefill/decode disaggregation: actors/core/
late_tokens.py). A step's result names a request `late`: its prompt was computed but its first
token comes in a later LateTokens. Until then it keeps its seat and blocks and is neither
planned nor a preemption victim; an abort ends it once and frees its blocks; its token, when it
lands, continues it exactly as if it had come with its step (the fake runner's tokens are a
pure function of the sequence, so a wrong position or block would change them)."""

from __future__ import annotations

from typing import Any

from troupe.actors.core.request_state import Status
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import (
    AbortRequest,
    FailedSeq,
    FinishReason,
    LateTokens,
    SampledToken,
    SamplingParams,
    SeqFailureReason,
    StepPlan,
    StepResult,
)
from troupe.messages.allocator import FreeRequest

from tests.actors.core.allocator_invariants import check_allocator
from tests.actors.core.stream_record import StreamRecord
from tests.actors.core.test_scheduler import Rig, prompt

Out = list[tuple[str, Any]]


class LateRig(Rig):
    """A Rig driven through handle(), recording what the streamer gets."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.record = StreamRecord()
        self.tokens, self.ends = self.record.tokens, self.record.ends

    def handle(self, msgs: list[Any]) -> Out:
        out = self.s.handle(msgs)
        for dest, msg in out:
            if dest == "streamer":
                self.record.add(msg)
        return out

    def run(
        self, out: Out, late: frozenset[str] = frozenset(), before: tuple[Any, ...] = ()
    ) -> tuple[StepPlan, tuple[SampledToken, ...], Out]:
        """Allocate the step `out` asks for, run it, and answer it with the tokens of `late`
        withheld (`before`: messages just ahead of the result): the plan, the withheld tokens,
        what the scheduler sent."""
        [batch] = [msg for dest, msg in out if dest == "allocator"]
        out = self.handle([self.a.apply(batch)])
        check_allocator(self.a)
        [plan] = [msg for dest, msg in out if dest == "executor"]
        sampled = self.r.execute(plan)
        held = tuple(s for s in sampled if s.request_id in late)
        result = StepResult(
            step_id=plan.step_id,
            time=1.0,
            sampled=tuple(s for s in sampled if s.request_id not in late),
            late=tuple(s.request_id for s in held),
        )
        return plan, held, self.handle([*before, result])

    def finish(self, out: Out) -> None:
        """Steps until idle; then every block is back."""
        while batches := [msg for dest, msg in out if dest == "allocator"]:
            out = self.handle([self.a.apply(batches[0])])
            check_allocator(self.a)
            if plans := [msg for dest, msg in out if dest == "executor"]:
                sampled = self.r.execute(plans[0])
                out = self.handle([StepResult(step_id=plans[0].step_id, time=1.0, sampled=sampled)])
        assert self.s.phase == "idle" and not self.s.requests
        assert self.s.stats().num_gpu_blocks_used == 0
        check_allocator(self.a)


def _late(step_id: int, *tokens: SampledToken, **kw: Any) -> LateTokens:
    return LateTokens(
        step_id=step_id,
        time=2.0,
        request_ids=tuple(t.request_id for t in tokens),
        sampled=tokens,
        **kw,
    )


def _ids(plan: StepPlan) -> list[str]:
    return [w.request_id for w in plan.seqs]


def _start(rig: LateRig) -> tuple[StepPlan, SampledToken, Out]:
    """b's prompt, b's decode, then step 3: b decodes and a's prompt samples late."""
    rig.add("b", prompt(3), max_tokens=6)
    _, _, out = rig.run(rig.handle([]))
    rig.add("a", prompt(6, 200), max_tokens=4)
    _, _, out = rig.run(out)
    plan, [held], out = rig.run(out, late=frozenset({"a"}))
    assert plan.step_id == 3 and _ids(plan) == ["b", "a"] and held.request_id == "a"
    a = rig.s.requests["a"]
    assert a.status == Status.AWAITING and a.num_computed == 6 and "a" not in rig.tokens
    assert len(rig.tokens["b"]) == 3  # b's token of that step came with it
    return plan, held, out


def test_a_late_token_lands_with_a_later_result() -> None:
    rig = LateRig()
    _, held, out = _start(rig)
    assert rig.s.stats().num_running == 2  # a keeps its seat
    # a is not planned while its token is on the way; its token comes with the next result
    plan, _, out = rig.run(out, before=(_late(3, held),))
    assert _ids(plan) == ["b"]
    assert rig.tokens["a"] == [held.token_id] and rig.s.requests["a"].status == Status.RUNNING
    plan, _, out = rig.run(out)
    assert _ids(plan) == ["b", "a"] and plan.seqs[1].start_pos == 6
    rig.finish(out)
    for rid, base, n, num in (("a", 200, 6, 4), ("b", 100, 3, 6)):
        expected = FakeRunner.reference_tokens(prompt(n, base), num, SamplingParams(max_tokens=num))
        assert rig.tokens[rid] == expected, rid
    assert rig.ends == {"a": [FinishReason.LENGTH], "b": [FinishReason.LENGTH]}


def test_a_late_token_lands_in_any_phase_and_wakes_an_idle_scheduler() -> None:
    rig = LateRig()
    rig.add("a", prompt(6, 200), max_tokens=3)
    # a alone, late (the router awaits a prefill share only with decodes beside it; the
    # scheduler does not care): after the round trip caching its full block, idle
    _, [held], out = rig.run(rig.handle([]), late=frozenset({"a"}))
    [batch] = [msg for dest, msg in out if dest == "allocator"]
    assert [type(op).__name__ for op in batch.ops] == ["CacheBlocks"]
    out = rig.handle([rig.a.apply(batch)])
    assert rig.s.phase == "idle" and [dest for dest, _ in out] == ["streamer"]
    rig.add("b", prompt(3), max_tokens=2)  # arrives while idle (no wake-up here)
    out = rig.handle([_late(1, held)])  # alone: the scheduler plans a's decode (and b)
    assert rig.tokens["a"] == [held.token_id] and any(dest == "allocator" for dest, _ in out)
    # while allocating: it lands too, and the plan in the making is not disturbed
    plan, [held_b], out = rig.run(out, late=frozenset({"b"}))
    assert _ids(plan) == ["a", "b"]
    assert rig.s.phase == "allocating"
    rig.handle([_late(plan.step_id, held_b)])
    assert rig.tokens["b"] == [held_b.token_id]
    rig.finish(out)
    assert rig.ends == {"a": [FinishReason.LENGTH], "b": [FinishReason.LENGTH]}


def test_abort_while_awaiting_ends_it_once_and_frees_its_blocks_at_once() -> None:
    rig = LateRig()
    _, held, out = _start(rig)
    used = rig.s.stats().num_gpu_blocks_used
    plan, _, out = rig.run(out, before=(AbortRequest(request_id="a"),))
    assert rig.ends["a"] == [FinishReason.ABORT]
    [batch] = [msg for dest, msg in out if dest == "allocator"]
    assert FreeRequest("a") in batch.ops  # freed with the next plan, not when its token comes
    plan, _, out = rig.run(out)
    assert plan.released == ("a",) and _ids(plan) == ["b"]
    assert rig.s.stats().num_gpu_blocks_used < used
    rig.handle([_late(3, held)])  # its token comes after all: dropped
    assert not rig.tokens["a"] and rig.ends["a"] == [FinishReason.ABORT]
    rig.finish(out)
    assert rig.ends == {"a": [FinishReason.ABORT], "b": [FinishReason.LENGTH]}


def test_an_awaiting_request_is_never_a_victim() -> None:
    # 3 blocks: b (4 tokens, later 8) and a; a is last in queue order, the usual victim
    rig = LateRig(num_gpu=3, mode="recompute", caching=False)
    rig.add("b", prompt(4), max_tokens=6)
    _, _, out = rig.run(rig.handle([]))
    rig.add("a", prompt(4, 200), max_tokens=3)
    _, _, out = rig.run(out)  # b's first decode (position 4, its second block)
    _, [held], out = rig.run(out, late=frozenset({"a"}))
    for _ in range(2):  # b decodes positions 6 and 7
        _, _, out = rig.run(out)
    # position 8 needs a third block: a holds it and is awaiting, so b gives way
    [batch] = [msg for dest, msg in out if dest == "allocator"]
    assert batch.ops == (FreeRequest("b"),)
    out = rig.handle([rig.a.apply(batch)])
    assert rig.s.requests["a"].status == Status.AWAITING
    assert rig.s.requests["b"].status == Status.WAITING
    assert rig.s.stats().num_preemptions_recompute == 1
    assert rig.s.phase == "idle"  # b does not fit beside a: nothing runs until a's token
    out = rig.handle([_late(3, held)])
    rig.finish(out)
    for rid, base, num in (("a", 200, 3), ("b", 100, 6)):
        expected = FakeRunner.reference_tokens(prompt(4, base), num, SamplingParams(max_tokens=num))
        assert rig.tokens[rid] == expected, rid


def test_late_failures_fail_alone_and_stale_tokens_are_dropped() -> None:
    rig = LateRig()
    _, _, out = _start(rig)
    nan = FailedSeq("a", SeqFailureReason.NON_FINITE_LOGITS)
    stale = _late(1, SampledToken("a", 5))  # another step's: not what a awaits
    ghost = _late(2, SampledToken("ghost", 5))
    failed = LateTokens(step_id=3, time=2.0, request_ids=("a",), failed=(nan,))
    _, _, out = rig.run(out, before=(stale, ghost, failed))
    assert not rig.tokens["a"] and rig.ends["a"] == [FinishReason.ERROR]
    rig.finish(out)
    assert rig.ends == {"a": [FinishReason.ERROR], "b": [FinishReason.LENGTH]}
    # an error on the late share fails its requests the same way
    rig.add("c", prompt(3, 300), max_tokens=2)
    rig.add("d", prompt(3, 400), max_tokens=2)
    plan, _, out = rig.run(rig.handle([]), late=frozenset({"c"}))
    error = LateTokens(step_id=plan.step_id, time=3.0, request_ids=("c",), error="died")
    _, _, out = rig.run(out, before=(error,))
    rig.finish(out)
    assert rig.ends["c"] == [FinishReason.ERROR] and rig.ends["d"] == [FinishReason.LENGTH]
