"""Speculative decoding in the cores: the n-gram proposer, the speculator's backoff, the
planner's proposals and Shrink (blocks held only for proposals go back, exactly), stop tokens
and max_tokens inside a verified run of tokens, and a property test over random load."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from troupe.actors.core.ngram_proposer import NgramIndex, propose_ngram
from troupe.actors.core.request_state import Request
from troupe.actors.core.speculator import SpecSettings, Speculator
from troupe.config import ConfigError, EngineConfig
from troupe.gpu.fake_runner import COPY_SEED_BASE, FakeRunner
from troupe.messages import AdmittedRequest, FinishReason, SampledToken, SamplingParams
from troupe.messages.allocator import AllocateBatch, Shrink
from troupe.messages.scheduler import AllocationResult
from troupe.ops.bench_scheduler import build_loop

from tests.actors.core.allocator_invariants import check_allocator
from tests.actors.core.test_scheduler_properties import _run, workloads


def test_proposer_prefers_longest_ngram_and_latest_full_match() -> None:
    tokens = [1, 2, 3, 4, 5, 6, 9, 2, 3, 7, 8, 1, 2, 3]
    # "1 2 3" (n=3) recurs at 0 only: its continuation wins over the later "2 3 7 8"
    assert propose_ngram(tokens, 3, 2, 3) == (4, 5, 6)
    assert propose_ngram(tokens, 3, 2, 2) == (7, 8, 1)  # "2 3": latest match with 3 after it
    assert propose_ngram([5, 6, 7, 8], 3, 2, 4) == ()  # nothing recurs
    assert propose_ngram([4, 4], 3, 2, 4) == ()  # too short to hold a match and its suffix
    assert propose_ngram([1, 2, 1, 2], 3, 2, 2) == (1, 2)  # continuation shorter than k


def _request(tokens: list[int], max_tokens: int = 50) -> Request:
    msg = AdmittedRequest(
        request_id="r",
        prompt_token_ids=tuple(tokens),
        params=SamplingParams(max_tokens=max_tokens),
        arrival_time=0.0,
        max_total_tokens=len(tokens) + max_tokens,
    )
    return Request.admit(msg, 1, frozenset({2}))


def test_backoff_per_request_and_per_step() -> None:
    spec = Speculator(SpecSettings(num_tokens=3, disable_batch_size=8, min_acceptance=0.3))
    assert spec.step_allows(7) and not spec.step_allows(8)
    req = _request([1, 2, 3, 1, 2])
    assert spec.propose(req, 10) == (3, 1, 2)
    assert spec.propose(req, 1) == (3,)  # the step's budget
    spec.record(req, 3, 0)
    spec.record(req, 3, 0)  # 1.0 -> 0.5 -> 0.25 < 0.3: paused
    assert req.spec_paused == spec.settings.backoff_steps
    for _ in range(spec.settings.backoff_steps):
        assert spec.propose(req, 10) == ()
    assert spec.propose(req, 10) == (3, 1, 2)  # probing again
    assert (spec.num_proposed, spec.num_accepted, spec.accepted_lengths) == (6, 0, [2, 0, 0, 0])
    near_end = _request([1, 2, 3, 1, 2], max_tokens=3)
    assert spec.propose(near_end, 10) == (3, 1)  # room for the target's own token after them


def test_config_checks_name_the_field() -> None:
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        EngineConfig(speculative_method="ngram", num_speculative_tokens=0)
    with pytest.raises(ConfigError, match="prompt_lookup_min"):
        EngineConfig(prompt_lookup_min=5, prompt_lookup_max=3)
    with pytest.raises(ConfigError, match="needs draft_model"):
        EngineConfig(speculative_method="draft_model")
    with pytest.raises(ConfigError, match="draft_model is set"):
        EngineConfig(draft_model="x")
    with pytest.raises(ConfigError, match="runner='model'"):
        EngineConfig(speculative_method="draft_model", draft_model="x", runner="fake")
    assert EngineConfig(speculative_method="draft_model", draft_model="x").num_proposals == 4
    assert EngineConfig(num_speculative_tokens=5).num_proposals == 0
    assert EngineConfig(speculative_method="ngram", num_speculative_tokens=5).num_proposals == 5


def _admit(loop, rid: str, prompt: tuple[int, ...], params: SamplingParams) -> None:  # type: ignore[no-untyped-def]
    loop.submit(
        [
            AdmittedRequest(
                request_id=rid,
                prompt_token_ids=prompt,
                params=params,
                arrival_time=0.0,
                max_total_tokens=len(prompt) + params.max_tokens,
            )
        ]
    )


def test_blocks_held_for_proposals_go_back_exactly() -> None:
    """Two requests propose up to 6 tokens (their tables cover them); one copies its prompt
    (accepted), the other's proposals fail and stop. The planner shrinks a table to what the
    step needs: after every allocation each request holds exactly the blocks of its tokens and
    this step's proposals."""
    spec_settings = SpecSettings(num_tokens=6, min_n=2, max_n=3)
    loop = build_loop(
        block_size=2,
        num_gpu_blocks=64,
        num_cpu_blocks=0,
        speculative=spec_settings,
        check=check_allocator,
    )
    prompt = (300, 301, 302, 303, 304) * 3
    params = SamplingParams(max_tokens=16, seed=COPY_SEED_BASE + 5)
    _admit(loop, "r", prompt, params)
    hashed = SamplingParams(max_tokens=12, seed=COPY_SEED_BASE + 3)  # not its prompt's period
    _admit(loop, "h", prompt, hashed)
    held: list[tuple[int, int]] = []
    shrinks: list[Shrink] = []
    original = loop.allocator.apply

    def apply(batch: AllocateBatch) -> AllocationResult:
        result = original(batch)
        shrinks.extend(op for op in batch.ops if isinstance(op, Shrink))
        for rid, work in loop.scheduler.planner.work.items():
            want = -(-(work.req.num_computed + work.num_tokens) // 2)
            held.append((len(loop.allocator.seqs[rid].table), want))
        return result

    loop.allocator.apply = apply  # type: ignore[method-assign]
    loop.run()
    assert loop.tokens["r"] == FakeRunner.reference_tokens(prompt, 16, params)
    assert loop.tokens["h"] == FakeRunner.reference_tokens(prompt, 12, hashed)
    assert shrinks, "the proposals never shrank"
    assert held and all(h == want for h, want in held), held
    spec = loop.scheduler.speculator
    assert 0 < spec.num_accepted < spec.num_proposed
    for plan in loop.plans:  # verifications last: one-token decodes lead each step
        has = [bool(w.draft_token_ids) for w in plan.seqs]
        assert has == sorted(has), plan
    assert not loop.allocator.seqs and loop.allocator.gpu.num_free == 64


def test_stop_token_inside_accepted_tokens_cuts_the_output() -> None:
    req = _request([1, 2, 3, 1, 2], max_tokens=20)
    req.draft = (3, 2, 5)  # 2 is EOS: accepted, so the 5 after it must not land
    spec = Speculator(SpecSettings(num_tokens=3))
    out = spec.land(req, SampledToken("r", 3, None, (2, 5, 8)), end=5)
    assert out is not None and out.token_ids == (3, 2) and out.finish_reason == FinishReason.STOP
    assert out.stop_reason == 2
    assert req.token_ids[5:] == [3, 2] and req.num_computed == 7
    req = _request([1, 2, 3, 1, 2], max_tokens=2)
    req.draft = (3, 1)
    out = spec.land(req, SampledToken("r", 3, None, (1, 5)), end=5)
    assert out is not None and out.token_ids == (3, 1) and out.finish_reason == FinishReason.LENGTH


def _with_copy_seeds(w: dict, period: int) -> dict:
    reqs = []
    for i, (rid, prompt, params, at, abort_at) in enumerate(w["reqs"]):
        if i % 2 == 0 and params.seed is not None and params.seed < 10:
            params = SamplingParams(
                max_tokens=params.max_tokens,
                priority=params.priority,
                seed=COPY_SEED_BASE + period,
            )
        reqs.append((rid, prompt, params, at, abort_at))
    return {**w, "reqs": reqs}


@settings(max_examples=40, deadline=None)
@given(workloads(), st.integers(1, 5), st.sampled_from(["auto", "swap", "recompute"]))
def test_random_load_with_speculation_matches_unlimited_pool(
    w: dict, period: int, mode: str
) -> None:
    _run(
        _with_copy_seeds(w, period), mode, speculative=SpecSettings(num_tokens=3, min_n=1, max_n=3)
    )


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), max_size=60),
    k=st.integers(0, 5),
    bounds=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    cuts=st.lists(st.integers(0, 60), max_size=6),
)
def test_ngram_index_answers_as_the_scan(
    tokens: list[int], k: int, bounds: tuple[int, int], cuts: list[int]
) -> None:
    """The incremental index equals the full scan at every prefix it is asked about, in
    order (each call extends the last), and after a shorter list (a rebuild)."""
    min_n, extra = bounds
    index = NgramIndex(min_n, min_n + extra)
    for end in [*sorted(cuts), len(tokens), *cuts[:1]]:
        prefix = tokens[:end]
        assert index.propose(prefix, k) == propose_ngram(prefix, k, min_n, min_n + extra)
