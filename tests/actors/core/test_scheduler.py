"""Exact tests of the scheduler core: plans, victims, aborts, errors and finish reasons."""

from __future__ import annotations

from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.request_state import Status
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.step_limits import StepLimits
from troupe.gpu.fake_runner import EOS_SEED_BASE, FakeRunner
from troupe.messages import (
    AbortRequest,
    AdmittedRequest,
    FinishReason,
    SamplingParams,
    StepPlan,
    StepResult,
    StopRequests,
    TokenBatch,
)
from troupe.messages.allocator import AllocateBatch, FreeRequest, Grow, SwapIn, SwapOut

from tests.actors.core.allocator_invariants import check_allocator

BS = 4


class Rig:
    """A scheduler and an allocator driven one call at a time, with a fake runner."""

    def __init__(
        self,
        num_gpu: int = 16,
        num_cpu: int = 8,
        budget: int = 64,
        max_seqs: int = 8,
        mode: str = "auto",
        caching: bool = True,
        policy: str = "priority",
    ) -> None:
        self.s = SchedulerCore(
            StepLimits(
                block_size=BS,
                num_gpu_blocks=num_gpu,
                max_num_seqs=max_seqs,
                max_num_batched_tokens=budget,
                enable_prefix_caching=caching,
            ),
            num_cpu_blocks=num_cpu,
            preemption_mode=mode,
            scheduling_policy=policy,
            eos_token_ids=[2],
        )
        self.a = AllocatorCore(
            block_size=BS,
            num_gpu_blocks=num_gpu,
            num_cpu_blocks=num_cpu,
            enable_prefix_caching=caching,
        )
        self.r = FakeRunner(block_size=BS, num_gpu_blocks=num_gpu, num_cpu_blocks=num_cpu)

    def add(self, rid: str, prompt: tuple[int, ...], max_tokens: int = 8, **kw: object) -> None:
        params = SamplingParams(max_tokens=max_tokens, **kw)  # type: ignore[arg-type]
        self.s.add(
            AdmittedRequest(
                request_id=rid,
                prompt_token_ids=prompt,
                params=params,
                arrival_time=0.0,
                max_total_tokens=len(prompt) + max_tokens,
            )
        )

    def allocate(self) -> tuple[AllocateBatch, StepPlan | None]:
        batch = self.s.schedule()
        assert batch is not None
        plan = self.s.on_allocated(self.a.apply(batch))
        check_allocator(self.a)
        return batch, plan

    def step(self) -> tuple[AllocateBatch, StepPlan, TokenBatch]:
        batch, plan = self.allocate()
        assert plan is not None
        out = self.s.update(
            StepResult(step_id=plan.step_id, time=1.0, sampled=self.r.execute(plan))
        )
        return batch, plan, out


def prompt(n: int, base: int = 100) -> tuple[int, ...]:
    return tuple(range(base, base + n))


def test_decodes_first_then_prefill_chunks_within_budget() -> None:
    rig = Rig(budget=8)
    rig.add("a", prompt(6))
    _, plan, _ = rig.step()
    assert [(w.request_id, w.start_pos, w.num_tokens, w.sample) for w in plan.seqs] == [
        ("a", 0, 6, True)
    ]
    assert plan.seqs[0].block_ids == (0, 1) and plan.seqs[0].reset
    rig.add("b", prompt(20, 300))
    _, plan, _ = rig.step()
    assert [(w.request_id, w.start_pos, w.num_tokens, w.sample) for w in plan.seqs] == [
        ("a", 6, 1, True),
        ("b", 0, 7, False),
    ]
    assert plan.seqs[0].params is None and plan.seqs[1].params is not None
    _, plan, _ = rig.step()
    assert [(w.request_id, w.start_pos, w.num_tokens) for w in plan.seqs] == [
        ("a", 7, 1),
        ("b", 7, 7),
    ]
    assert plan.seqs[0].block_ids == () and plan.seqs[1].block_ids == (4, 5)
    assert not plan.seqs[1].reset


def test_preempts_lowest_priority_latest_arrival_for_recompute() -> None:
    rig = Rig(num_gpu=4, mode="recompute", caching=False)
    rig.add("b", prompt(4, 100))
    rig.add("a", prompt(4, 200), priority=-1)  # lower value: served first
    rig.add("c", prompt(4, 300))
    rig.step()  # three blocks used, one free; each now needs a second block
    batch, plan, out = rig.step()
    assert batch.ops == (FreeRequest("c"), Grow("a", 5), Grow("b", 5))
    assert [w.request_id for w in plan.seqs] == ["a", "b"]
    assert [r.request_id for r in rig.s.queues.waiting] == ["c"]
    assert rig.s.queues.waiting[0].num_computed == 0
    assert out.stats is not None and out.stats.num_preemptions_recompute == 1


def test_swap_preemption_and_resume_before_new_requests() -> None:
    rig = Rig(num_gpu=4, num_cpu=4, mode="auto", caching=False)
    rig.add("a", prompt(4, 100))
    rig.add("b", prompt(4, 200))
    rig.add("c", prompt(4, 300))
    rig.step()
    batch, plan, out = rig.step()
    assert batch.ops == (SwapOut("c"), Grow("a", 5), Grow("b", 5))
    assert plan.swap_out == ((2, 0),)
    assert [r.request_id for r in rig.s.queues.swapped] == ["c"]
    assert out.stats is not None and out.stats.num_preemptions_swap == 1
    rig.add("d", prompt(2, 400))
    rig.s.abort("a")
    batch, plan = rig.allocate()
    # a's blocks come back; c resumes (its table is rebuilt) before d may be admitted, and
    # takes the last two blocks, so d waits.
    assert batch.ops == (FreeRequest("a"), SwapIn("c", 5))
    assert plan is not None
    works = {w.request_id: w for w in plan.seqs}
    assert works["c"].reset and works["c"].params is None and works["c"].start_pos == 4
    # c's CPU block goes into the first block of its rebuilt two-block table
    assert len(set(works["c"].block_ids)) == 2 and plan.released == ("a",)
    assert plan.swap_in == ((0, works["c"].block_ids[0]),)
    assert [r.request_id for r in rig.s.queues.waiting] == ["d"] and not rig.s.queues.swapped


def test_swap_mode_without_cpu_room_recomputes() -> None:
    rig = Rig(num_gpu=4, num_cpu=0, mode="swap", caching=False)
    for rid, base in (("a", 100), ("b", 200), ("c", 300)):
        rig.add(rid, prompt(4, base))
    rig.step()
    batch, _, _ = rig.step()
    assert batch.ops[0] == FreeRequest("c")


def test_abort_waiting_running_and_mid_step() -> None:
    rig = Rig(max_seqs=1)
    rig.add("a", prompt(5))
    rig.add("b", prompt(5, 200))
    out = rig.s.handle(
        [AbortRequest(request_id="b", reason="client went away"), AbortRequest(request_id="ghost")]
    )
    assert out[0][0] == "streamer"
    aborted = out[0][1]
    assert isinstance(aborted, TokenBatch)
    assert [(o.request_id, o.finish_reason, o.error) for o in aborted.outputs] == [
        ("b", FinishReason.ABORT, "client went away")
    ]
    assert out[1][0] == "allocator"  # idle with work: the round trip starts
    plan = rig.s.on_allocated(rig.a.apply(out[1][1]))  # type: ignore[arg-type]
    assert plan is not None
    # Mid-step abort: the step's token for "a" is ignored, its blocks freed next round trip.
    out = rig.s.handle([AbortRequest(request_id="a")])
    assert [o.finish_reason for o in out[0][1].outputs] == [FinishReason.ABORT]  # type: ignore[attr-defined]
    sampled = rig.r.execute(plan)
    out = rig.s.handle([StepResult(step_id=plan.step_id, time=2.0, sampled=sampled)])
    assert out[0][1].outputs == ()  # type: ignore[attr-defined]
    assert out[1][0] == "allocator" and out[1][1].ops == (FreeRequest("a"),)  # type: ignore[attr-defined]
    final = rig.s.handle([rig.a.apply(out[1][1])])  # type: ignore[arg-type, list-item]
    stats = final[0][1].stats  # type: ignore[attr-defined]
    assert final[0][0] == "streamer" and stats.num_gpu_blocks_used == 0
    assert stats.num_gpu_blocks_cached == 0 and len(final) == 1  # idle now
    assert rig.s.phase == "idle"


def test_step_error_fails_its_requests() -> None:
    rig = Rig()
    rig.add("a", prompt(3))
    _, plan = rig.allocate()
    assert plan is not None
    out = rig.s.update(StepResult(step_id=plan.step_id, time=1.0, error="CUDA error: boom"))
    assert [(o.request_id, o.finish_reason, o.error) for o in out.outputs] == [
        ("a", FinishReason.ERROR, "step failed: CUDA error: boom")
    ]
    batch = rig.s.schedule()
    assert batch is not None and batch.ops == (FreeRequest("a"),)


def test_prompt_larger_than_pool_fails_with_clear_message() -> None:
    rig = Rig(num_gpu=2)
    out = rig.s.handle(
        [
            AdmittedRequest(
                request_id="big",
                prompt_token_ids=prompt(9),
                params=SamplingParams(),
                arrival_time=0.0,
                max_total_tokens=25,
            )
        ]
    )
    [(dest, batch)] = out
    assert dest == "streamer"
    [o] = batch.outputs  # type: ignore[attr-defined]
    assert o.finish_reason == FinishReason.ERROR
    assert o.error == (
        "request needs 3 KV blocks of 4 tokens for its 9 tokens, but the GPU pool "
        "holds only 2 (num_kv_blocks)"
    )


def test_growth_past_the_pool_fails_when_alone() -> None:
    rig = Rig(num_gpu=2)
    rig.add("a", prompt(7), max_tokens=5)
    _, _, out = rig.step()  # 7 prompt tokens + 1 sampled: 2 blocks are full
    assert out.outputs[0].finish_reason is None
    _, _, out = rig.step()
    assert out.outputs[0].finish_reason is None
    batch = rig.s.schedule()  # position 8 needs a third block
    assert batch is not None and batch.ops[-1] == FreeRequest("a")
    out = rig.s.stats_batch()
    assert out.outputs[0].finish_reason == FinishReason.ERROR
    assert "needs 3 KV blocks" in (out.outputs[0].error or "")


def test_finish_reasons_eos_stop_ids_and_length() -> None:
    rig = Rig()
    ref = FakeRunner.reference_tokens(prompt(3), 4, SamplingParams())
    rig.add("eos", prompt(3, 500), seed=EOS_SEED_BASE + 2)
    rig.add("ignore", prompt(3, 500), seed=EOS_SEED_BASE + 2, ignore_eos=True, max_tokens=3)
    rig.add("stop", prompt(3), stop_token_ids=(ref[1],))
    ends: dict[str, tuple[list[int], object, object]] = {}
    while rig.s.requests:
        _, _, out = rig.step()
        for o in out.outputs:
            toks = ends.get(o.request_id, ([], None, None))[0] + list(o.token_ids)
            ends[o.request_id] = (toks, o.finish_reason, o.stop_reason)
    assert ends["eos"][1:] == (FinishReason.STOP, 2) and ends["eos"][0][-1] == 2
    assert len(ends["eos"][0]) == 2
    assert ends["ignore"][1:] == (FinishReason.LENGTH, None) and len(ends["ignore"][0]) == 3
    assert ends["stop"] == (ref[:2], FinishReason.STOP, ref[1])


def test_stop_requests_free_silently() -> None:
    rig = Rig()
    rig.add("a", prompt(3))
    rig.step()
    out = rig.s.handle([StopRequests(request_ids=("a", "unknown"))])
    assert [dest for dest, _ in out] == ["allocator"]
    assert out[0][1].ops == (FreeRequest("a"),)  # type: ignore[attr-defined]
    assert rig.s.requests == {}


def test_priority_then_fcfs_admission_order() -> None:
    rig = Rig(max_seqs=2)
    rig.add("low", prompt(2))
    rig.add("high", prompt(2, 200), priority=-5)  # as in vLLM: a lower value is served first
    rig.add("low2", prompt(2, 300))
    rig.add("later", prompt(2, 400), priority=3)
    _, plan, _ = rig.step()
    assert [w.request_id for w in plan.seqs] == ["high", "low"]
    assert (
        rig.s.queues.waiting[0].request_id == "low2"
        and rig.s.queues.waiting[0].status == Status.WAITING
    )


def _pump(rig: Rig, out: list) -> list:  # type: ignore[type-arg]
    """Answer the scheduler's allocator and executor messages until it goes idle; return what
    it sent to the streamer."""
    to_streamer = []
    while out:
        replies = []
        for dest, msg in out:
            if dest == "allocator":
                replies.append(rig.a.apply(msg))
                check_allocator(rig.a)
            elif dest == "executor":
                replies.append(
                    StepResult(step_id=msg.step_id, time=3.0, sampled=rig.r.execute(msg))
                )
            else:
                to_streamer.append(msg)
        out = rig.s.handle(replies) if replies else []
    return to_streamer


def test_abort_while_swapped_frees_its_cpu_blocks() -> None:
    rig = Rig(num_gpu=4, num_cpu=4, mode="auto", caching=False)
    for rid, base in (("a", 100), ("b", 200), ("c", 300)):
        rig.add(rid, prompt(4, base))
    rig.step()
    rig.step()  # c is swapped out to the CPU pool
    assert [r.request_id for r in rig.s.queues.swapped] == ["c"] and rig.a.cpu.num_free == 3
    out = rig.s.handle([AbortRequest(request_id="c"), AbortRequest(request_id="a")])
    aborted = [o for d, m in out if d == "streamer" for o in m.outputs]  # type: ignore[attr-defined]
    assert [(o.request_id, o.finish_reason) for o in aborted][:2] == [
        ("c", FinishReason.ABORT),
        ("a", FinishReason.ABORT),
    ]
    assert not rig.s.queues.swapped
    _pump(rig, out)
    _pump(rig, rig.s.handle([AbortRequest(request_id="b")]))
    stats = rig.s.stats()
    assert rig.a.cpu.num_free == 4 and stats.num_cpu_blocks_used == 0
    assert stats.num_gpu_blocks_used == 0 and rig.s.phase == "idle"


def test_abort_mid_swap_frees_gpu_and_cpu_blocks() -> None:
    rig = Rig(num_gpu=4, num_cpu=4, mode="auto", caching=False)
    for rid, base in (("a", 100), ("b", 200), ("c", 300)):
        rig.add(rid, prompt(4, base))
    rig.step()
    batch, plan = rig.allocate()  # this step swaps c out: the copy is in flight
    assert plan is not None and plan.swap_out and batch.ops[0] == SwapOut("c")
    rig.s.handle([AbortRequest(request_id="c")])  # the abort arrives mid-swap
    sampled = rig.r.execute(plan)
    out = rig.s.handle(
        [
            StepResult(step_id=plan.step_id, time=2.0, sampled=sampled),
            AbortRequest(request_id="a"),
            AbortRequest(request_id="b"),
        ]
    )
    _pump(rig, out)
    stats = rig.s.stats()
    assert rig.a.cpu.num_free == 4 and stats.num_cpu_blocks_used == 0
    assert stats.num_gpu_blocks_used == 0 and stats.num_running + stats.num_swapped == 0
