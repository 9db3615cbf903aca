"""vLLM's metrics from hand-built events and stats: parallel samples, aborts and failures, and
the scheduler-state families (waiting counts the swapped, usage is a fraction, preemptions of
both modes, tokens per step)."""

from __future__ import annotations

from troupe.gateway.metrics import GatewayMetrics
from troupe.messages import (
    Aborted,
    Delta,
    EngineStats,
    Failed,
    Finished,
    FinishReason,
    RejectCode,
    Rejected,
    Timings,
    Usage,
)

from tests.gateway.metrics_page import StubEngine, parse, summary

TIMES = Timings(ttft=0.5, tpot=0.25, e2e=2.0, queue=0.25, prefill=0.25, decode=1.5, inference=1.75)


def _finished(rid: str, index: int, left: int, completion: int) -> Finished:
    return Finished(
        request_id=rid,
        text="",
        token_ids=(7,),
        finish_reason=FinishReason.LENGTH,
        usage=Usage(prompt_tokens=12, completion_tokens=completion, cached_tokens=8),
        timings=TIMES,
        index=index,
        samples_left=left,
        params_n=3,
        params_max_tokens=30,
    )


def test_parallel_samples_aborts_failures_and_rejections() -> None:
    metrics = GatewayMetrics(StubEngine())  # type: ignore[arg-type]
    events = [
        # "p": n=3; sample 1 ends first, then 0, then 2 (the longest, 25 tokens)
        Delta(request_id="p", text="", token_ids=(5, 6), prompt_tokens=12),
        Delta(request_id="p", text="", token_ids=(5,), index=1, prompt_tokens=12),
        _finished("p", 1, 2, 10),
        _finished("p", 0, 1, 20),
        _finished("p", 2, 0, 25),
        # "q": aborted after one token; "f": failed before any; "r": never ran
        Delta(request_id="q", text="", token_ids=(9,), prompt_tokens=4),
        Aborted(
            request_id="q",
            reason="client went away",
            usage=Usage(prompt_tokens=4, completion_tokens=1),
            timings=Timings(ttft=0.1, tpot=None, e2e=0.2),
        ),
        Failed(request_id="f", message="boom"),
        Rejected(request_id="r", code=RejectCode.INVALID_REQUEST, message="no"),
    ]
    for event in events:
        metrics.on_event(event, 1.0)
    page = parse(metrics.render().decode())
    # prompts: p once (its sample 0's first token) and q; tokens: every sample's
    assert page[("troupe_prompt_tokens_total", ())] == 12 + 4
    assert page[("troupe_generation_tokens_total", ())] == 2 + 1 + 3 + 1
    success = {r: page[("troupe_request_success_total", (("finished_reason", r),))] for r in (
        "stop", "length", "abort", "error")}  # fmt: skip
    assert success == {"stop": 0, "length": 1, "abort": 1, "error": 1}  # rejections: not run
    # the request's sample 0 is its one observation
    assert summary(page, "troupe_request_queue_time_seconds", "0.3") == (1, 0.25, 1)
    assert summary(page, "troupe_request_generation_tokens", "20.0") == (1, 20, 1)
    assert summary(page, "troupe_request_prefill_kv_computed_tokens", "5.0") == (1, 4, 1)
    assert summary(page, "troupe_request_params_max_tokens", "20.0", "50.0") == (1, 30, 0, 1)
    # once the last sample ended: the longest sample, and n
    assert summary(page, "troupe_request_max_num_generation_tokens", "20.0", "50.0") == (
        1, 25, 0, 1,
    )  # fmt: skip
    assert summary(page, "troupe_request_params_n", "2.0", "5.0") == (1, 3, 0, 1)
    assert not metrics.vllm._most_generated  # nothing kept for ended requests


def test_scheduler_state_in_vllm_terms() -> None:
    engine = StubEngine()
    engine.latest = EngineStats(
        num_gpu_blocks=40,
        num_gpu_blocks_used=10,
        num_running=3,
        num_waiting=2,
        num_swapped=1,
        num_preemptions_swap=4,
        num_preemptions_recompute=5,
        prefix_cache_query_tokens=100,
        prefix_cache_hit_tokens=60,
        # steps of <=1, <=8 (two), <=64, and one above 16384 tokens
        steps_by_tokens=(1, 2, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1),
        num_step_tokens=1 + 7 + 8 + 50 + 20000,
    )
    page = parse(GatewayMetrics(engine).render().decode())  # type: ignore[arg-type]
    assert page[("troupe_num_requests_running", ())] == 3
    assert page[("troupe_num_requests_waiting", ())] == 3  # vLLM's waiting holds the preempted
    assert page[("troupe_kv_cache_usage_perc", ())] == 0.25
    assert page[("troupe_num_preemptions_total", ())] == 9
    assert page[("troupe_prefix_cache_queries_total", ())] == 100
    assert page[("troupe_prefix_cache_hits_total", ())] == 60
    name = "troupe_iteration_tokens_total"
    assert summary(page, name, "1.0", "8.0", "32.0", "64.0", "16384.0", "+Inf") == (
        5, 20066, 1, 3, 3, 4, 4, 5,
    )  # fmt: skip
