"""Parallel sampling in the scheduler and allocator: one prefill, a Fork into k samples that
share its blocks (copy on write of the partial one), each sample a request of its own."""

from __future__ import annotations

from collections import defaultdict

import pytest
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.step_limits import StepLimits
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import (
    AbortRequest,
    AdmittedRequest,
    FinishReason,
    SamplingParams,
    StepResult,
    TokenBatch,
)
from troupe.messages.allocator import AllocateBatch, AllocateNew, Fork, SwapOut
from troupe.messages.samples import SAMPLE_SEP, sample_id, sample_params

from tests.actors.core.allocator_invariants import check_allocator


class Rig:
    """Scheduler, allocator and fake runner, pumped by hand; every allocation is checked."""

    def __init__(
        self,
        *,
        bs: int = 16,
        num_gpu: int = 512,
        num_cpu: int = 256,
        budget: int = 4096,
        max_seqs: int = 16,
        mode: str = "auto",
        caching: bool = True,
    ) -> None:
        self.bs, self.max_seqs = bs, max_seqs
        self.s = SchedulerCore(
            StepLimits(
                block_size=bs,
                num_gpu_blocks=num_gpu,
                max_num_seqs=max_seqs,
                max_num_batched_tokens=budget,
                enable_prefix_caching=caching,
            ),
            num_cpu_blocks=num_cpu,
            preemption_mode=mode,
            eos_token_ids=[2],
        )
        self.a = AllocatorCore(
            block_size=bs,
            num_gpu_blocks=num_gpu,
            num_cpu_blocks=num_cpu,
            enable_prefix_caching=caching,
        )
        self.r = FakeRunner(block_size=bs, num_gpu_blocks=num_gpu, num_cpu_blocks=num_cpu)
        self.batches: list[AllocateBatch] = []
        self.tokens: dict[str, list[int]] = defaultdict(list)
        self.ends: dict[str, list[FinishReason]] = defaultdict(list)
        self.after_fork: list[int] = []  # GPU blocks used right after each Fork

    def add(self, rid: str, prompt: list[int], params: SamplingParams) -> None:
        msg = AdmittedRequest(
            request_id=rid,
            prompt_token_ids=tuple(prompt),
            params=params,
            arrival_time=0.0,
            max_total_tokens=len(prompt) + params.max_tokens,
        )
        self.pump(self.s.handle([msg]))

    def pump(self, out: list, *, steps: int | None = None) -> None:  # type: ignore[type-arg]
        """Answer allocator and executor messages until idle (or `steps` executor steps)."""
        while out:
            replies = []
            for dest, msg in out:
                if dest == "allocator":
                    self.batches.append(msg)
                    replies.append(self.a.apply(msg))
                    check_allocator(self.a)
                    if any(isinstance(op, Fork) for op in msg.ops):
                        self.after_fork.append(self.a.gpu.num_blocks - self.a.gpu.num_free)
                elif dest == "executor":
                    if steps is not None:
                        if steps == 0:
                            self.held = msg
                            return
                        steps -= 1
                    sampled = self.r.execute(msg)
                    replies.append(StepResult(step_id=msg.step_id, time=1.0, sampled=sampled))
                elif isinstance(msg, TokenBatch):
                    for o in msg.outputs:
                        self.tokens[o.request_id] += o.token_ids
                        if o.finish_reason is not None:
                            self.ends[o.request_id].append(o.finish_reason)
            out = self.s.handle(replies) if replies else []
            assert len(self.s.queues.running) <= self.max_seqs

    def forks(self) -> list[Fork]:
        return [op for b in self.batches for op in b.ops if isinstance(op, Fork)]

    def check_all_back(self) -> None:
        assert self.s.phase == "idle" and not self.s.requests
        assert self.a.gpu.num_free == self.a.gpu.num_blocks and not self.a.seqs
        assert self.a.cpu.num_free == self.a.cpu.num_blocks
        check_allocator(self.a)


def prompt_of(n: int, base: int = 100) -> list[int]:
    return [base + (i * 7919) % 20000 for i in range(n)]


def expected(prompt: list[int], params: SamplingParams, i: int) -> list[int]:
    return FakeRunner.reference_tokens(prompt, params.max_tokens, sample_params(params, i))


def test_eight_samples_share_one_prefill_of_a_thousand_token_prompt() -> None:
    rig = Rig()
    prompt = prompt_of(1000)
    params = SamplingParams(n=8, max_tokens=12, seed=1000)
    rig.add("p", prompt, params)
    (fork,) = rig.forks()
    assert fork.num_computed == 999 and len(fork.child_ids) == 8
    # The prompt was allocated once: 63 blocks for its 999 shared tokens (62 full + 1
    # partial), plus one copy of the partial block for each sample but the first.
    num_prompt_blocks = -(-999 // 16)
    assert rig.after_fork == [num_prompt_blocks + 7]
    starts = [op for b in rig.batches for op in b.ops if isinstance(op, AllocateNew)]
    assert [op.request_id for op in starts] == ["p"]  # no sample prefilled anything
    for i in range(8):
        sid = sample_id("p", i)
        assert rig.tokens[sid] == expected(prompt, params, i), i
        assert rig.ends[sid] == [FinishReason.LENGTH]
        # ... and each equals the same request run alone with that sample's seed
        alone = Rig()
        seed_i = SamplingParams(max_tokens=12, seed=1000 + i)
        alone.add("solo", prompt, seed_i)
        assert alone.tokens["solo"] == rig.tokens[sid]
    assert len({tuple(rig.tokens[sample_id("p", i)]) for i in range(8)}) == 8
    rig.check_all_back()


def test_shared_blocks_hold_one_reference_per_sample() -> None:
    rig = Rig()
    params = SamplingParams(n=8, max_tokens=40, seed=5)
    msg = AdmittedRequest(
        request_id="p",
        prompt_token_ids=tuple(prompt_of(1000)),
        params=params,
        arrival_time=0.0,
        max_total_tokens=1040,
    )
    rig.pump(rig.s.handle([msg]), steps=2)  # the prefill, then the fork step
    tables = [rig.a.seqs[sample_id("p", i)].table for i in range(8)]
    for b in tables[0][:62]:
        assert rig.a.gpu.ref[b] == 8
    assert len({t[62] for t in tables}) == 8  # the partial block: one each
    assert all(t[:62] == tables[0][:62] for t in tables)
    assert all(rig.a.sharing.count(sample_id("p", i)) == 62 for i in range(8))
    rig.pump([*rig.s.handle([AbortRequest(request_id="p")]), ("executor", rig.held)])
    rig.check_all_back()


@pytest.mark.parametrize("when", [0, 1, 3])
def test_abort_of_the_parent_ends_every_sample_once(when: int) -> None:
    rig = Rig(budget=256)  # the prompt takes 4 steps: abort mid-prefill, at the fork, after
    params = SamplingParams(n=4, max_tokens=50, seed=1)
    msg = AdmittedRequest(
        request_id="p",
        prompt_token_ids=tuple(prompt_of(600)),
        params=params,
        arrival_time=0.0,
        max_total_tokens=650,
    )
    rig.pump(rig.s.handle([msg]), steps=when)
    out = rig.s.handle([AbortRequest(request_id="p")])
    aborts = [o for _, m in out if isinstance(m, TokenBatch) for o in m.outputs]
    # one ABORT under the parent's id: the streamer ends each open sample with it
    assert [(o.request_id, o.finish_reason) for o in aborts] == [("p", FinishReason.ABORT)]
    rig.pump([*out, ("executor", rig.held)])
    assert all(r != FinishReason.LENGTH for v in rig.ends.values() for r in v)
    rig.check_all_back()


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preempted_samples_still_equal_their_lone_runs(mode: str) -> None:
    # 40 blocks of 4 tokens: two 4-sample requests of 30-token prompts that each grow to 70
    # tokens cannot all fit; samples are swapped out or recomputed, and come back.
    rig = Rig(bs=4, num_gpu=40, num_cpu=64, max_seqs=8, mode=mode)
    params = [
        SamplingParams(n=4, max_tokens=40, seed=10),
        SamplingParams(best_of=4, n=4, max_tokens=40, seed=20),
    ]
    prompts = [prompt_of(30, 100), prompt_of(30, 5000)]
    msgs = [
        AdmittedRequest(
            request_id=f"r{j}",
            prompt_token_ids=tuple(prompts[j]),
            params=params[j],
            arrival_time=0.0,
            max_total_tokens=70,
        )
        for j in range(2)
    ]
    rig.pump(rig.s.handle(msgs))
    stats = rig.s.stats()
    assert stats.num_preemptions_swap + stats.num_preemptions_recompute > 0
    ops = [op for b in rig.batches for op in b.ops]
    if mode == "swap":  # samples themselves were swapped out
        assert any(isinstance(op, SwapOut) and SAMPLE_SEP in op.request_id for op in ops)
    else:  # ... or freed and computed again from their prompt and output
        assert any(isinstance(op, AllocateNew) and SAMPLE_SEP in op.request_id for op in ops)
    for j in range(2):
        for i in range(4):
            sid = sample_id(f"r{j}", i)
            assert rig.tokens[sid] == expected(prompts[j], params[j], i), sid
    rig.check_all_back()


def test_one_token_prompt_forks_at_admission_and_block_aligned_prompts_copy_nothing() -> None:
    rig = Rig(bs=4)
    params = SamplingParams(n=3, max_tokens=5, seed=3)
    rig.add("one", [300], params)
    rig.add("aligned", prompt_of(9), params)  # 8 shared tokens: two full blocks, no partial
    assert [len(f.child_ids) for f in rig.forks()] == [3]
    for rid, prompt in (("one", [300]), ("aligned", prompt_of(9))):
        for i in range(3):
            assert rig.tokens[sample_id(rid, i)] == expected(prompt, params, i)
    rig.check_all_back()


def test_forks_wait_for_seats_counted_from_admission() -> None:
    rig = Rig(max_seqs=4)
    params = SamplingParams(n=3, max_tokens=6, seed=9)
    for rid in ("a", "b"):
        msg = AdmittedRequest(
            request_id=rid,
            prompt_token_ids=tuple(prompt_of(40)),
            params=params,
            arrival_time=0.0,
            max_total_tokens=46,
        )
        out = rig.s.handle([msg])
        assert len(rig.s.queues.running) <= 4
        rig.pump(out)
    for rid in ("a", "b"):
        for i in range(3):
            assert rig.tokens[sample_id(rid, i)] == expected(prompt_of(40), params, i)
    rig.check_all_back()


def test_abort_while_the_fork_is_being_allocated_frees_every_sample() -> None:
    rig = Rig()
    msg = AdmittedRequest(
        request_id="p",
        prompt_token_ids=tuple(prompt_of(50)),
        params=SamplingParams(n=3, max_tokens=8, seed=2),
        arrival_time=0.0,
        max_total_tokens=58,
    )
    (prefill,) = [m for d, m in rig.s.handle([msg]) if d == "allocator"]
    plan = rig.s.on_allocated(rig.a.apply(prefill))
    assert plan is not None
    rig.s.update(StepResult(step_id=plan.step_id, time=1.0, sampled=rig.r.execute(plan)))
    fork_batch = rig.s.schedule()
    assert fork_batch is not None and any(isinstance(op, Fork) for op in fork_batch.ops)
    out = rig.s.handle([AbortRequest(request_id="p")])  # arrives while the allocator works
    ends = [o for _, m in out if isinstance(m, TokenBatch) for o in m.outputs]
    assert [(o.request_id, o.finish_reason) for o in ends] == [("p", FinishReason.ABORT)]
    plan = rig.s.on_allocated(rig.a.apply(fork_batch))
    check_allocator(rig.a)
    assert plan is not None and not plan.seqs and plan.copy_blocks and plan.released == ("p",)
    rig.s.update(StepResult(step_id=plan.step_id, time=1.0, sampled=rig.r.execute(plan)))
    rig.pump(rig.s.handle([]))  # the next batch frees the three samples
    rig.check_all_back()


def test_more_samples_than_seats_fail_with_a_message() -> None:
    rig = Rig(max_seqs=2)
    params = SamplingParams(n=3, max_tokens=4)
    out = rig.s.handle(
        [
            AdmittedRequest(
                request_id="p",
                prompt_token_ids=(5, 6, 7),
                params=params,
                arrival_time=0.0,
                max_total_tokens=7,
            )
        ]
    )
    ends = [o for _, m in out if isinstance(m, TokenBatch) for o in m.outputs]
    assert [(o.request_id, o.finish_reason) for o in ends] == [("p", FinishReason.ERROR)]
    assert "max_num_seqs" in (ends[0].error or "")


def test_a_fork_that_needs_blocks_others_forked_this_step_took_gives_way() -> None:
    # 5 blocks of 4 tokens: r2's 10-token prompt holds 3, r1's 2-token one 1. r2 forks first
    # (its second sample copies the partial block: the last free one); r1's fork then needs
    # one more. r2's samples are out of the running queue until the step's loops end, yet
    # they hold blocks: r1 is not alone, so it gives way (recomputed) rather than count on a
    # pool its own blocks would be all of.
    rig = Rig(bs=4, num_gpu=5, num_cpu=0, budget=8, max_seqs=4, caching=False)
    params = SamplingParams(n=2, max_tokens=1, ignore_eos=True)
    prompts = {"r2": list(range(140, 150)), "r1": [120, 121]}
    msgs = [
        AdmittedRequest(
            request_id=rid,
            prompt_token_ids=tuple(prompt),
            params=params,
            arrival_time=0.0,
            max_total_tokens=len(prompt) + 1,
        )
        for rid, prompt in prompts.items()
    ]
    rig.pump(rig.s.handle(msgs))  # was the allocator's "Fork ... needs 1 blocks, 0 are free"
    for rid, prompt in prompts.items():
        for i in range(2):
            assert rig.tokens[sample_id(rid, i)] == expected(prompt, params, i)
    assert rig.s.stats().num_preemptions_recompute > 0
    rig.check_all_back()
