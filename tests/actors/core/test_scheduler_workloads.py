"""Whole-workload tests of scheduler + allocator + fake runner: chunked prefill next to decodes,
and a shared system prompt through the prefix cache."""

from __future__ import annotations

import pytest
from troupe.config import ConfigError, EngineConfig
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import AdmittedRequest, FinishReason, SamplingParams
from troupe.ops.bench_scheduler import build_loop


def _req(rid: str, prompt: tuple[int, ...], max_tokens: int) -> AdmittedRequest:
    return AdmittedRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        params=SamplingParams(max_tokens=max_tokens),
        arrival_time=0.0,
        max_total_tokens=len(prompt) + max_tokens,
    )


def test_long_prompt_is_chunked_and_never_stalls_decodes() -> None:
    budget = 512
    loop = build_loop(max_num_batched_tokens=budget, max_num_seqs=128)
    shorts = [
        _req(f"d{i}", tuple(200 + (i * 13 + j) % 900 for j in range(8)), 40) for i in range(64)
    ]
    long_prompt = tuple(100 + (j * 7) % 20000 for j in range(10_000))
    loop.submit(shorts)
    loop.run({4: [_req("long", long_prompt, 3)]})

    assert max(plan.num_tokens for plan in loop.plans) <= budget
    prefill_plans = [
        p for p in loop.plans if any(w.request_id == "long" and not w.sample for w in p.seqs)
    ]
    assert len(prefill_plans) >= 10_000 // budget
    for plan in prefill_plans:
        decodes = [w for w in plan.seqs if w.request_id != "long"]
        assert len(decodes) == 64 and all(w.num_tokens == 1 and w.sample for w in decodes)
        assert plan.num_tokens == budget  # the prefill takes exactly what decodes leave
    assert loop.tokens["long"] == FakeRunner.reference_tokens(long_prompt, 3)
    for req in shorts:
        assert loop.tokens[req.request_id] == FakeRunner.reference_tokens(req.prompt_token_ids, 40)
        assert loop.finished[req.request_id] == [(FinishReason.LENGTH, None)]


def test_chunk_cap_splits_every_prefill_and_keeps_outputs() -> None:
    cap = 96
    loop = build_loop(max_num_batched_tokens=4096, max_num_seqs=64, max_chunk_tokens=cap)
    system = tuple(100 + (j * 31) % 5000 for j in range(700))
    reqs = [_req(f"r{i}", (*system, *(7000 + i * 8 + k for k in range(40))), 6) for i in range(6)]
    loop.submit(reqs[:3])
    loop.run({6: reqs[3:]})  # later arrivals find the shared prefix cached

    prompt_lens = {r.request_id: len(r.prompt_token_ids) for r in reqs}
    chunks: dict[str, list[int]] = {r.request_id: [] for r in reqs}
    for plan in loop.plans:
        for w in plan.seqs:
            if w.start_pos < prompt_lens[w.request_id]:
                assert w.num_tokens <= cap, (w.request_id, w.start_pos, w.num_tokens)
                chunks[w.request_id].append(w.num_tokens)
    assert all(len(c) >= 740 // cap for c in list(chunks.values())[:1])  # the first computes all
    assert max(plan.num_tokens for plan in loop.plans) <= 6 * cap  # no step carries a whole prompt
    for req in reqs:
        assert loop.tokens[req.request_id] == FakeRunner.reference_tokens(req.prompt_token_ids, 6)
    stats = loop.batches[-1].stats
    assert stats is not None and stats.num_gpu_blocks_used == 0
    assert stats.prefix_cache_hit_tokens > 0


@pytest.mark.parametrize("value", [-1, 1.5, "256"])
def test_chunk_cap_is_checked(value: object) -> None:
    with pytest.raises(ConfigError, match="long_prefill_token_threshold must be an integer >= 0"):
        EngineConfig(long_prefill_token_threshold=value)  # type: ignore[arg-type]


def _shared_prompt_run(caching: bool) -> tuple[dict[str, list[int]], int, int]:
    loop = build_loop(max_num_batched_tokens=4096, enable_prefix_caching=caching)
    system = tuple(100 + (j * 31) % 5000 for j in range(1000))
    loop.submit(
        _req(f"r{i}", (*system, *(7000 + i * 8 + k for k in range(8))), 4) for i in range(200)
    )
    loop.run()
    computed = sum(plan.num_tokens for plan in loop.plans)
    stats = loop.batches[-1].stats
    assert stats is not None and stats.num_gpu_blocks_used == 0
    return dict(loop.tokens), computed, stats.prefix_cache_hit_tokens


def test_shared_system_prompt_is_computed_once() -> None:
    cached_tokens, cached_computed, hits = _shared_prompt_run(True)
    plain_tokens, plain_computed, no_hits = _shared_prompt_run(False)
    assert cached_tokens == plain_tokens
    assert len(cached_tokens) == 200 and all(len(t) == 4 for t in cached_tokens.values())
    # 1,000 = 62 full blocks of 16 (992 tokens) + 8: every later request hits all 62 blocks.
    assert (hits, no_hits) == (199 * 992, 0)
    decode_tokens = 200 * 3
    assert cached_computed == 1008 + 199 * 16 + decode_tokens
    assert plain_computed == 200 * 1008 + decode_tokens
