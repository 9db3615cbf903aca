"""vLLM's metrics on /metrics (troupe_ + vLLM's name): exact counts, sums and buckets.

Requests run through the real scheduler, allocator, executor (fake runner, fake clock) and
streamer cores; their events go to GatewayMetrics.on_event at the times the engine stamped;
the page is parsed with prometheus_client's parser. Every series carries model_name.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.executor import ExecutorCore
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.step_limits import StepLimits
from troupe.actors.core.streamer import StreamerCore
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.gateway.metrics import GatewayMetrics
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import (
    AdmittedRequest,
    RequestOpened,
    SamplingParams,
    StepPlan,
    StreamBatch,
    TokenBatch,
)

from tests.gateway.metrics_page import Samples, StubEngine, buckets, parse, summary

BS = 4


class Graph:
    """The engine's cores wired by hand, run until idle; events go to the metrics listener."""

    def __init__(self, max_num_seqs: int) -> None:
        self.scheduler = SchedulerCore(
            StepLimits(
                block_size=BS,
                num_gpu_blocks=32,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=64,
            ),
            num_cpu_blocks=8,
        )
        self.allocator = AllocatorCore(block_size=BS, num_gpu_blocks=32, num_cpu_blocks=8)
        self.step_times = (100.0 + 0.5 * k for k in range(1, 1000))  # step k ends at 100 + k/2
        runner = FakeRunner(block_size=BS, num_gpu_blocks=32, num_cpu_blocks=8)
        self.executor = ExecutorCore(runner, clock=lambda: next(self.step_times))
        self.streamer = StreamerCore(load_tokenizer())
        self.engine = StubEngine()
        self.metrics = GatewayMetrics(self.engine)  # type: ignore[arg-type]

    def submit(self, rid: str, prompt: tuple[int, ...], params: SamplingParams, at: float) -> None:
        self.streamer.handle(
            [
                RequestOpened(
                    request_id=rid,
                    params=params,
                    num_prompt_tokens=len(prompt),
                    prompt_tail_ids=prompt[-2:],
                    arrival_time=at,
                )
            ]
        )
        self.run(
            AdmittedRequest(
                request_id=rid,
                prompt_token_ids=prompt,
                params=params,
                arrival_time=at,
                max_total_tokens=len(prompt) + params.max_tokens,
            )
        )

    def run(self, *msgs: msgspec.Struct) -> None:
        inbox = list(msgs)
        while inbox:
            out, inbox = self.scheduler.handle(inbox), []  # type: ignore[arg-type]
            for dest, msg in out:
                if dest == "allocator":
                    inbox += [m for _, m in self.allocator.handle([msg])]  # type: ignore[list-item]
                elif dest == "executor":
                    assert isinstance(msg, StepPlan)
                    inbox += [m for _, m in self.executor.handle([msg])]
                else:
                    assert dest == "streamer" and isinstance(msg, TokenBatch)
                    self._stream(msg)

    def _stream(self, batch: TokenBatch) -> None:
        for dest, msg in self.streamer.handle([batch]):
            if dest == "scheduler":
                self.run(msg)
            elif dest == "client":
                assert isinstance(msg, StreamBatch)
                if msg.stats is not None:
                    self.engine.latest = msg.stats
                for event in msg.events:  # dispatched when the engine stamped the step
                    self.metrics.on_event(event, batch.time)

    def scrape(self) -> Samples:
        return parse(self.metrics.render().decode())


@pytest.fixture
def served() -> Iterator[Samples]:
    """a and b arrive together at 100.0; one seat, so b waits for a's four steps."""
    graph = Graph(max_num_seqs=1)
    params = SamplingParams(max_tokens=4, ignore_eos=True, seed=1)
    for rid, prompt in (("a", (11, 12, 13, 14, 15)), ("b", (21, 22, 23, 24, 25))):
        graph.submit(rid, prompt, params, at=100.0)
    assert not graph.scheduler.requests  # both ended
    yield graph.scrape()


def test_latency_breakdown_of_queued_requests(served: Samples) -> None:
    # a: scheduled at once (100.0); tokens at 100.5, 101.0, 101.5, 102.0.
    # b: scheduled after a's last step (102.0); tokens at 102.5 .. 104.0.
    phase = ("0.3", "0.5", "1.5", "2.0", "2.5")
    assert summary(served, "troupe_request_queue_time_seconds", *phase) == (2, 2.0, 1, 1, 1, 2, 2)
    assert summary(served, "troupe_request_prefill_time_seconds", *phase) == (2, 1.0, 0, 2, 2, 2, 2)
    assert summary(served, "troupe_request_decode_time_seconds", *phase) == (2, 3.0, 0, 0, 2, 2, 2)
    assert summary(served, "troupe_request_inference_time_seconds", *phase) == (
        2, 4.0, 0, 0, 0, 2, 2,
    )  # fmt: skip
    # e2e: a 2.0, b 4.0 (troupe's existing histogram, its own buckets)
    assert summary(served, "troupe_e2e_request_latency_seconds", "2.5", "5.0") == (2, 6.0, 1, 2)
    tpot = ("0.4", "0.5")
    assert summary(served, "troupe_request_time_per_output_token_seconds", *tpot) == (2, 1.0, 0, 2)
    assert set(buckets(served, "troupe_request_queue_time_seconds")) == {
        "0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0",
        "40.0", "50.0", "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0", "7680.0", "+Inf",
    }  # fmt: skip


def test_token_counts_and_request_shapes(served: Samples) -> None:
    assert served[("troupe_prompt_tokens_total", ())] == 10
    assert served[("troupe_generation_tokens_total", ())] == 8
    for reason, count in (("length", 2), ("stop", 0), ("abort", 0), ("error", 0)):
        assert served[("troupe_request_success_total", (("finished_reason", reason),))] == count
    tokens = ("2.0", "5.0", "50.0", "+Inf")
    for name, total in (
        ("troupe_request_prompt_tokens", 10),
        ("troupe_request_prefill_kv_computed_tokens", 10),  # nothing cached
        ("troupe_request_generation_tokens", 8),
        ("troupe_request_params_max_tokens", 8),
        ("troupe_request_max_num_generation_tokens", 8),
    ):
        assert summary(served, name, *tokens) == (2, total, 0, 2, 2, 2), name
    assert set(buckets(served, "troupe_request_prompt_tokens")) == {
        "1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "+Inf",
    }  # fmt: skip
    assert summary(served, "troupe_request_params_n", "1.0", "2.0") == (2, 2, 2, 2)


def test_tokens_per_engine_step(served: Samples) -> None:
    # Each request: a 5-token prefill step, then 3 one-token decodes.
    name = "troupe_iteration_tokens_total"
    assert summary(served, name, "1.0", "8.0", "16384.0", "+Inf") == (8, 16, 6, 8, 8, 8)
    assert served[("troupe_num_requests_running", ())] == 0
    assert served[("troupe_num_requests_waiting", ())] == 0
    assert served[("troupe_kv_cache_usage_perc", ())] == 0.0
    assert served[("troupe_num_preemptions_total", ())] == 0
    queries = served[("troupe_prefix_cache_queries_total", ())]
    assert queries == served[("troupe_prefix_cache_query_tokens_total", ())] == 10
    assert served[("troupe_prefix_cache_hits_total", ())] == 0
