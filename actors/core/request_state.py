"""Requests as the scheduler sees them (request_queues.py holds the live ones). No block ids: the
allocator owns them; a request keeps only the counts the allocator reports."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from troupe.actors.core.embeds_check import cache_namespace
from troupe.actors.core.ngram_proposer import NgramIndex
from troupe.actors.core.step_work import Kind, Work
from troupe.messages.common import FinishReason
from troupe.messages.events import FailureCause
from troupe.messages.images import PromptImage, cache_tokens
from troupe.messages.prompt_embeds import PromptEmbeds
from troupe.messages.sampling import SamplingParams
from troupe.messages.scheduler import AdmittedRequest
from troupe.messages.streamer import SeqOutput


class Status(enum.IntEnum):
    WAITING = 0  # no blocks (new, or preempted for recompute)
    RUNNING = 1  # blocks on the GPU
    SWAPPED = 2  # blocks in the CPU pool
    FINISHED = 3
    AWAITING = 4  # computed, its token late (disaggregation: late_tokens.py); holds its blocks


@dataclass(slots=True, eq=False, kw_only=True)  # eq=False: queues find requests by identity
class Request:
    """Mutable scheduler-side state of one request (never leaves the scheduler)."""

    # The fields each step reads for every running request come first (fewer cache lines).
    request_id: str
    status: Status = Status.WAITING
    num_computed: int = 0  # tokens whose KV is in the request's blocks (GPU or CPU)
    token_ids: list[int]
    num_blocks: int = 0  # positions of its GPU table (counted from its grants)
    decode: Work = field(init=False)  # its plan entry for a decode that needs no new block
    needs_reset: bool = True  # next SeqWork replaces the executor's block table
    num_committed_blocks: int = 0  # leading blocks the allocator has cached/hashed
    stop_ids: frozenset[int]
    max_total_tokens: int  # prompt + max_tokens, capped by max_model_len
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache (first start)
    in_executor: bool = False  # the executor holds its state (params sent)
    was_scheduled: bool = False  # in a planned step once (scheduler_step_facts.py)
    params: SamplingParams
    prompt_len: int
    arrival_seq: int
    sort_key: tuple[int, ...] = ()  # the queue policy's, fixed while queued
    num_released: int = 0  # of num_blocks, released behind a window (after a streaming one's sinks)
    num_shared: int = 0  # of the held ones, blocks others hold too (allocator-reported)
    num_cpu_blocks: int = 0  # while swapped
    in_allocator: bool = False  # the allocator holds blocks for it (or an op is in flight)
    draft: tuple[int, ...] = ()  # proposals in the step in flight
    proposed: tuple[int, ...] = ()  # the draft model's proposals after its last token
    spec_rate: float = 1.0  # acceptance rate of its proposals (speculator.py)
    spec_paused: int = 0  # decode steps left without proposals (speculator.py backoff)
    ngrams: NgramIndex | None = None  # its n-grams' positions, made at its first proposal
    num_samples: int = 1  # > 1: a parent of parallel samples, not forked yet (sample_fork.py)
    late_step: int = 0  # while AWAITING: the step whose token it awaits
    stream_window: int = 0  # StreamingLLM (SamplingParams.streaming_window), 0: off
    num_sink_tokens: int = 0
    # An embeddings prompt: its rows, kept for every (re)computation of the prompt (plan_builder
    # cuts each chunk's share), and its prefix-cache namespace (embeds_check.cache_namespace)
    embeds: PromptEmbeds | None = None
    images: tuple[PromptImage, ...] = ()  # its images, kept as the rows are (plan_builder)
    cache_namespace: str = field(init=False)

    def __post_init__(self) -> None:
        self.cache_namespace = cache_namespace(self.params.cache_namespace, self.embeds)
        self.decode = Work(self, 1, Kind.RUN)  # made once: the common decode allocates nothing

    @classmethod
    def admit(cls, msg: AdmittedRequest, arrival_seq: int, eos_ids: frozenset[int]) -> Request:
        params, prompt = msg.params, msg.prompt_token_ids
        return cls(
            request_id=msg.request_id,
            params=params,
            token_ids=list(prompt),
            prompt_len=len(prompt),
            max_total_tokens=msg.max_total_tokens,
            arrival_seq=arrival_seq,
            stop_ids=(frozenset() if params.ignore_eos else eos_ids) | set(params.stop_token_ids),
            num_samples=params.num_samples,
            stream_window=params.streaming_window or 0,
            num_sink_tokens=(params.sink_tokens or 0) if params.is_streaming else 0,
            embeds=msg.prompt_embeds,
            images=msg.images,
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def cache_tokens(self, start: int, stop: int) -> tuple[int, ...]:
        """Its tokens start .. stop - 1 as the prefix cache keys them (an image's rows by the
        image: messages/images.cache_tokens)."""
        if not self.images:
            return tuple(self.token_ids[start:stop])
        return cache_tokens(self.token_ids, self.images, start, stop)

    def append_token(self, token_id: int) -> FinishReason | None:
        """Append one sampled token; the finish reason (STOP, LENGTH) if it ends the request."""
        self.token_ids.append(token_id)
        if token_id in self.stop_ids:
            return FinishReason.STOP
        return FinishReason.LENGTH if len(self.token_ids) >= self.max_total_tokens else None

    def failed(self, message: str, cause: FailureCause = FailureCause.INTERNAL) -> SeqOutput:
        """Its terminal output when it fails with `message`."""
        return SeqOutput(
            self.request_id,
            (),
            FinishReason.ERROR,
            None,
            None,
            self.num_cached_tokens,
            message,
            cause,
        )

    @property
    def compute_end(self) -> int:
        """Tokens it computes before sampling: all, but a parent stops before its last one."""
        return len(self.token_ids) - (self.num_samples > 1)
