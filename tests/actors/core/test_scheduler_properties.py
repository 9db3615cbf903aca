"""Property tests: scheduler + allocator + fake runner under random load, tiny pools, aborts.

Whatever the pool size and preemption mode, every request that is not aborted must produce
exactly the tokens it produces with an unlimited pool (the fake runner's output depends on every
KV slot it reads back), end exactly once, and leave every block free or cached.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from troupe.gpu.fake_runner import EOS_SEED_BASE, FakeRunner
from troupe.messages import AbortRequest, AdmittedRequest, FinishReason, SamplingParams
from troupe.ops.bench_scheduler import build_loop

BLOCK = 4


@st.composite
def workloads(draw: st.DrawFn) -> dict:
    num = draw(st.integers(1, 10))
    shared = draw(st.lists(st.integers(100, 120), min_size=0, max_size=9))
    reqs = []
    for i in range(num):
        own = draw(st.lists(st.integers(100, 120), min_size=1, max_size=14))
        max_tokens = draw(st.integers(1, 24))
        eos_at = draw(st.sampled_from([None, None, None, 1, 3]))
        seed = EOS_SEED_BASE + eos_at if eos_at is not None else draw(st.integers(0, 3))
        params = SamplingParams(
            max_tokens=max_tokens,
            priority=draw(st.integers(0, 2)),
            seed=seed,
        )
        prompt = tuple(shared + own) if draw(st.booleans()) else tuple(own)
        at = draw(st.integers(0, 12))
        abort_at = draw(st.one_of(st.none(), st.none(), st.integers(0, 40)))
        reqs.append((f"r{i}", prompt, params, at, abort_at))
    return {
        "reqs": reqs,
        "num_gpu_blocks": draw(st.integers(6, 20)),
        "num_cpu_blocks": draw(st.sampled_from([0, 3, 8, 64])),
        "max_num_seqs": draw(st.integers(1, 8)),
        "budget": draw(st.integers(4, 40)),
        "caching": draw(st.booleans()),
    }


def _expected(prompt: tuple[int, ...], params: SamplingParams) -> tuple[list[int], FinishReason]:
    tokens = FakeRunner.reference_tokens(prompt, params.max_tokens, params)
    if 2 in tokens:
        return tokens[: tokens.index(2) + 1], FinishReason.STOP
    return tokens, FinishReason.LENGTH


def _run(w: dict, mode: str) -> None:
    loop = build_loop(
        block_size=BLOCK,
        num_gpu_blocks=w["num_gpu_blocks"],
        num_cpu_blocks=w["num_cpu_blocks"],
        max_num_seqs=w["max_num_seqs"],
        max_num_batched_tokens=w["budget"],
        enable_prefix_caching=w["caching"],
        preemption_mode=mode,
        check=True,
    )
    inject: dict[int, list] = {}
    for rid, prompt, params, at, abort_at in w["reqs"]:
        msg = AdmittedRequest(
            request_id=rid,
            prompt_token_ids=prompt,
            params=params,
            arrival_time=float(at),
            max_total_tokens=len(prompt) + params.max_tokens,
        )
        inject.setdefault(at, []).append(msg)
        if abort_at is not None:
            inject.setdefault(at + abort_at, []).append(AbortRequest(request_id=rid))
    inject.setdefault(0, []).append(AbortRequest(request_id="nobody"))  # unknown: ignored
    loop.run(inject)

    pool_tokens = w["num_gpu_blocks"] * BLOCK
    for rid, prompt, params, _, abort_at in w["reqs"]:
        ends = loop.finished[rid]
        assert len(ends) == 1, f"{rid}: terminal events {ends}"
        reason, error = ends[0]
        tokens, expected_reason = _expected(prompt, params)
        if reason == FinishReason.ABORT:
            assert abort_at is not None
            assert loop.tokens[rid] == tokens[: len(loop.tokens[rid])]
        elif reason == FinishReason.ERROR:
            # Only a request that cannot fit in the whole pool may fail.
            assert error is not None and "GPU pool holds only" in error, error
            assert len(prompt) + len(loop.tokens[rid]) + 1 > pool_tokens - BLOCK + 1
        else:
            assert (loop.tokens[rid], reason) == (tokens, expected_reason), rid
    alloc = loop.allocator
    assert not alloc.seqs, f"blocks still held by {sorted(alloc.seqs)}"
    assert alloc.gpu.num_used == 0 and alloc.cpu.num_used == 0
    assert loop.runner.num_live <= len(w["reqs"])
    stats = loop.batches[-1].stats
    assert stats is not None and stats.num_gpu_blocks_used == 0 and stats.num_running == 0
    assert stats.num_gpu_blocks_cached == alloc.gpu.num_cached


_settings = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(workloads())
def test_random_load_matches_unlimited_pool_auto(w: dict) -> None:
    _run(w, "auto")


@_settings
@given(workloads())
def test_random_load_matches_unlimited_pool_swap(w: dict) -> None:
    _run(w, "swap")


@_settings
@given(workloads())
def test_random_load_matches_unlimited_pool_recompute(w: dict) -> None:
    _run(w, "recompute")
