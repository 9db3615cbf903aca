"""Speculation never makes a workload noticeably slower (issue 10, point 4), in step tokens:
the cost model (spec_cost.py) and the speculator's per-step backoff. With no proposals the
executor gets exactly the plans it gets with speculation off (so the same decode graphs and
overlapped steps); above the batch where proposals cannot pay there are none; a workload whose
proposals never come stops asking the proposer, and probes again later."""

from __future__ import annotations

from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.request_state import Request
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.speculator import SpecSettings, Speculator
from troupe.actors.core.step_limits import StepLimits
from troupe.config import EngineConfig
from troupe.gpu.fake_runner import COPY_SEED_BASE, FakeRunner
from troupe.messages import AdmittedRequest, SamplingParams, StepPlan
from troupe.ops.bench_scheduler import CoreLoop
from troupe.spec_cost import SpecCost, batch_limit, spec_cost

from tests.actors.core.allocator_invariants import check_allocator

BLOCKS = 512


def _loop(spec: SpecSettings | None) -> CoreLoop:
    """Cores as the GPU runs them: one lookahead slot per decode (the overlap schedule)."""
    scheduler = SchedulerCore(
        StepLimits(
            block_size=4,
            num_gpu_blocks=BLOCKS,
            max_num_seqs=64,
            max_num_batched_tokens=256,
            num_lookahead_tokens=1,
        ),
        num_cpu_blocks=0,
        eos_token_ids=(2,),
        speculative=spec,
    )
    allocator = AllocatorCore(block_size=4, num_gpu_blocks=BLOCKS, num_cpu_blocks=0)
    runner = FakeRunner(block_size=4, num_gpu_blocks=BLOCKS, num_cpu_blocks=0, max_model_len=512)
    return CoreLoop(scheduler, allocator, runner, check=check_allocator)


def _run(spec: SpecSettings | None, num: int, copy: bool) -> CoreLoop:
    """`num` requests; `copy`: each output repeats its prompt (n-gram proposals match),
    else hashed tokens that never repeat a 2-gram of the distinct prompt tokens."""
    loop = _loop(spec)
    for i in range(num):
        prompt = tuple(1000 + 40 * i + j for j in range(12))
        seed = COPY_SEED_BASE + 12 if copy else i
        params = SamplingParams(max_tokens=24, seed=seed, ignore_eos=True)
        loop.submit([_admitted(f"r{i}", prompt, params)])
    loop.run()
    assert len(loop.finished) == num
    assert loop.allocator.gpu.num_free == BLOCKS  # every block came back
    return loop


def _admitted(rid: str, prompt: tuple[int, ...], params: SamplingParams) -> AdmittedRequest:
    return AdmittedRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        params=params,
        arrival_time=0.0,
        max_total_tokens=len(prompt) + params.max_tokens,
    )


def _plans(loop: CoreLoop) -> list[StepPlan]:
    return loop.plans


def test_cost_model_in_step_tokens() -> None:
    cost = SpecCost(num_tokens=4, fixed_tokens=128, overhead=0.4)
    assert cost.token_share(128) == 0.5
    # batch 1: a step is nearly all fixed cost, one accepted token in four pays the overhead
    assert cost.pays(1, accepted=1.0, proposed=4.0)
    assert not cost.pays(1, accepted=0.4, proposed=4.0)  # ... not less than the overhead
    # batch 256: 4 proposals cost 2.67 decode-step tokens' worth; 2 accepted do not pay
    assert not cost.pays(256, accepted=2.0, proposed=4.0)
    assert cost.pays(256, accepted=3.5, proposed=4.0)
    assert not cost.pays(8, accepted=0.0, proposed=0.0)  # nothing proposed: nothing to win
    top = cost.max_batch()
    assert cost.pays(top, 4.0, 4.0) and not cost.pays(top + 1, 4.0, 4.0)
    assert SpecCost(num_tokens=1, overhead=1.5).max_batch() == 0  # one token never pays 1.5


def test_batch_limit_from_the_config() -> None:
    ngram = EngineConfig(speculative_method="ngram", speculative_disable_by_batch_size=None)
    assert batch_limit(ngram) == spec_cost(ngram).max_batch() + 1
    assert batch_limit(ngram.replace(speculative_disable_by_batch_size=32)) == 32
    # a draft model's round raises the overhead: proposals stop paying at a smaller batch
    draft = ngram.replace(speculative_method="draft_model", draft_model="d")
    assert spec_cost(draft).overhead > spec_cost(ngram).overhead
    limit = batch_limit(draft)
    assert limit is not None and limit < batch_limit(ngram)  # type: ignore[operator]
    assert batch_limit(EngineConfig()) == 32  # speculation off: the setting as it is
    assert batch_limit(ngram.replace(speculative_cost_model=False)) is None


def test_no_proposals_means_the_plans_of_speculation_off() -> None:
    """Proposals that never match: every StepPlan equals speculation off's (same SeqWorks,
    so the same decode graphs and overlap hits on the GPU), and the proposer is soon left
    alone by the per-step backoff."""
    off = _run(None, 6, copy=False)
    on = _run(SpecSettings(num_tokens=4, backoff_steps=4, cost=SpecCost(4)), 6, copy=False)
    spec = on.scheduler.speculator
    assert spec.num_proposed == 0
    assert _plans(on) == _plans(off)
    assert spec.num_steps_held > 0  # proposing stopped: nothing came of it
    assert spec.per_decode < 1.0


def test_matching_proposals_change_the_plans() -> None:
    """The same comparison can fail: when proposals match they are verified."""
    off = _run(None, 2, copy=True)
    on = _run(SpecSettings(num_tokens=4, cost=SpecCost(4)), 2, copy=True)
    assert on.scheduler.speculator.num_accepted > 0
    assert _plans(on) != _plans(off)
    assert len(on.plans) < len(off.plans)  # fewer steps for the same tokens
    assert on.tokens == off.tokens


def test_cost_model_turns_proposals_off_at_large_batch() -> None:
    """Matching proposals at a batch past max_batch: none are made, plans as without."""
    cost = SpecCost(num_tokens=4, fixed_tokens=2, overhead=0.4)  # pays below batch 18
    assert cost.max_batch() == 17
    settings = SpecSettings(num_tokens=4, cost=cost, disable_batch_size=cost.max_batch() + 1)
    off = _run(None, 24, copy=True)
    on = _run(settings, 24, copy=True)
    spec = on.scheduler.speculator
    # only the last few requests (all others done) may still propose
    big = [p for p in on.plans if len(p.seqs) > cost.max_batch()]
    assert big and not any(w.draft_token_ids for p in big for w in p.seqs)
    assert on.tokens == off.tokens
    # a small batch of the same workload proposes
    assert _run(settings, 4, copy=True).scheduler.speculator.num_accepted > 0
    assert spec.batch <= 24


def _request(tokens: list[int]) -> Request:
    msg = _admitted("r", tuple(tokens), SamplingParams(max_tokens=50))
    return Request.admit(msg, 1, frozenset({2}))


def test_measured_backoff_holds_steps_then_probes() -> None:
    spec = Speculator(SpecSettings(num_tokens=4, backoff_steps=3, cost=SpecCost(4)))
    nothing = _request([5, 6, 7, 8, 9])  # no n-gram recurs: no proposals
    opened = 0
    while spec.step_allows(8):  # optimistic start: open until the averages say otherwise
        assert spec.propose(nothing, 10) == ()
        opened += 1
        assert opened <= 5, "proposals that never come never stop"
    held = 1
    while not spec.step_allows(8):
        held += 1
        assert held <= 3, "never probed"
    assert held == 3 and spec.num_steps_held == 3
    assert spec.step_allows(8)  # the probe step
    assert spec.propose(nothing, 10) == ()
    assert not spec.step_allows(8)  # probed, nothing came: held again, twice as long
    for _ in range(5):
        assert not spec.step_allows(8)
    assert spec.step_allows(8) and spec.num_steps_held == 3 + 6
    match = _request([1, 2, 3, 1, 2])
    assert spec.propose(match, 10) == (3, 1, 2)
    spec.record(match, 3, 3)
    assert spec.step_allows(8)  # proposals came and were accepted: it pays


def test_low_acceptance_at_large_batch_pauses_the_request() -> None:
    """The per-request threshold is the token share of the step: at batch 8 half the
    proposals accepted keeps a request proposing, at batch 200 it pauses it."""
    settings = SpecSettings(num_tokens=4, min_acceptance=0.0, cost=SpecCost(4))
    spec = Speculator(settings)
    for batch, paused in ((8, False), (200, True)):
        req = _request([1, 2, 3, 1, 2])
        spec.step_allows(batch)
        for _ in range(4):
            spec.record(req, 4, 2)
        assert (req.spec_paused > 0) == paused
