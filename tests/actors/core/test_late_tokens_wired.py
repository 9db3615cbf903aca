"""Prefill/decode disaggregation through the scheduler, allocator and phase router cores, with
two fake runners as the two sides (their pools paired: the router's send_blocks/recv_blocks
copy blocks between them, by step, as gpu/kv_transfer.py does). Deterministic, no threads:
the decode side runs each share as soon as it may (what its receives need is there), the
prefill side only when nothing else can move, so the decode side answers ahead of every
prompt's sampling chunk. Each prompt's first token then comes late; every token is still the
one a correct cache gives (the fake runner's tokens are a pure function of the sequence),
every request ends once and every block comes back."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.phase_router import PhaseRouterCore
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.step_limits import StepLimits
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import (
    AdmittedRequest,
    FinishReason,
    Phase,
    PhaseStepResult,
    SamplingParams,
    StepPlan,
    StepResult,
)

from tests.actors.core.allocator_invariants import check_allocator
from tests.actors.core.stream_record import StreamRecord

BS = 4
PROMPTS = [[(13 * i + 5 * j + 1) % 250 + 3 for j in range(3 + 5 * i)] for i in range(5)]
Block = tuple[np.ndarray, np.ndarray, np.ndarray, Any]


class Wired:
    """The cores and two fake sides, pumped one message at a time."""

    def __init__(self, num_blocks: int) -> None:
        self.s = SchedulerCore(
            StepLimits(
                block_size=BS, num_gpu_blocks=num_blocks, max_num_seqs=4, max_num_batched_tokens=8
            ),
            num_cpu_blocks=0,
            preemption_mode="recompute",
        )
        self.a = AllocatorCore(block_size=BS, num_gpu_blocks=num_blocks, num_cpu_blocks=0)
        self.router = PhaseRouterCore(block_size=BS, seed=0)
        self.sides = {p: FakeRunner(block_size=BS, num_gpu_blocks=num_blocks) for p in Phase}
        self.shares: dict[Phase, deque[StepPlan]] = {p: deque() for p in Phase}
        self.mail: dict[tuple[Phase, int, int], Block] = {}  # (to, step, block) -> contents
        self.pending: deque[tuple[str, Any]] = deque()
        self.record = StreamRecord()
        self.tokens, self.ends = self.record.tokens, self.record.ends
        self.decodes_answered_ahead = 0  # decode answers while a sampling chunk was queued
        self.clock = 0.0

    def route(self, out: list[tuple[str, Any]], source: str) -> None:
        for dest, msg in out:
            if dest == "streamer":
                self.record.add(msg)
            elif dest == "executor" and source == "scheduler":
                self.pending.append(("router", msg))
            elif dest in ("executor", "prefill_executor"):
                self.shares[Phase.DECODE if dest == "executor" else Phase.PREFILL].append(msg)
            else:
                assert dest in ("allocator", "scheduler"), dest
                self.pending.append((dest, msg))

    def ready(self, side: Phase) -> bool:
        queue = self.shares[side]
        return bool(queue) and all(
            (side, queue[0].step_id, b) in self.mail for b in queue[0].recv_blocks
        )

    def run_share(self, side: Phase) -> None:
        share = self.shares[side].popleft()
        store = self.sides[side].gpu
        other = Phase.PREFILL if side == Phase.DECODE else Phase.DECODE
        for b in share.send_blocks:  # what the pool holds before this step
            copy = (store.tok[:, b].copy(), store.pos[:, b].copy(), store.mix[:, b].copy())
            self.mail[(other, share.step_id, b)] = (*copy, store.sum[b])
        for b in share.recv_blocks:
            tok, pos, mix, total = self.mail.pop((side, share.step_id, b))
            store.tok[:, b], store.pos[:, b], store.mix[:, b], store.sum[b] = tok, pos, mix, total
        if side == Phase.DECODE and any(
            w.sample for q in self.shares[Phase.PREFILL] for w in q.seqs
        ):
            self.decodes_answered_ahead += 1
        self.clock += 1.0
        result = StepResult(
            step_id=share.step_id, time=self.clock, sampled=self.sides[side].execute(share)
        )
        self.pending.append(("phase", PhaseStepResult(phase=side, result=result)))

    def pump(self) -> None:
        while True:
            if self.pending:
                dest, msg = self.pending.popleft()
                if dest == "allocator":
                    self.route(self.s.handle([self.a.apply(msg)]), "scheduler")
                    check_allocator(self.a)
                elif dest == "scheduler":
                    self.route(self.s.handle([msg]), "scheduler")
                else:  # a plan, or a side's answer
                    self.route(self.router.handle([msg]), "router")
            elif self.ready(Phase.DECODE):
                self.run_share(Phase.DECODE)
            elif self.shares[Phase.PREFILL]:  # only when nothing else can move
                assert self.ready(Phase.PREFILL), "the prefill side waits on the decode side"
                self.run_share(Phase.PREFILL)
            else:
                assert not self.shares[Phase.DECODE], "the decode side waits forever"
                return


def _params(i: int) -> SamplingParams:
    return SamplingParams(max_tokens=6 + i % 3, seed=100 + i)


def _run(num_blocks: int) -> Wired:
    w = Wired(num_blocks)
    for i, prompt in enumerate(PROMPTS):
        admitted = AdmittedRequest(
            request_id=f"r{i}",
            prompt_token_ids=tuple(prompt),
            params=_params(i),
            arrival_time=0.0,
            max_total_tokens=len(prompt) + _params(i).max_tokens,
        )
        w.pending.append(("scheduler", admitted))
    w.pump()
    return w


def _check(w: Wired) -> None:
    for i, prompt in enumerate(PROMPTS):
        params = _params(i)
        expected = FakeRunner.reference_tokens(prompt, params.max_tokens or 0, params)
        assert w.tokens[f"r{i}"] == expected, i
        assert w.ends[f"r{i}"] == [FinishReason.LENGTH]
    assert w.s.phase == "idle" and not w.s.requests
    assert w.s.stats().num_gpu_blocks_used == 0
    assert w.router.joins.num_ahead == 0


def test_first_tokens_come_late_and_decodes_never_wait_for_them() -> None:
    w = _run(num_blocks=64)
    _check(w)
    assert w.decodes_answered_ahead > 0  # decodes answered while a sampling chunk waited
    assert w.router.joins.num_late >= 3  # first tokens that came after their step's result


def test_late_tokens_under_recompute_preemption() -> None:
    w = _run(num_blocks=12)
    _check(w)
    assert w.s.stats().num_preemptions_recompute > 0
    assert w.router.joins.num_late > 0
