"""Requests as the scheduler sees them, and the queues that hold the live ones. No block ids:
the allocator owns them; a request keeps only the counts the allocator reports."""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field
from operator import attrgetter

import msgspec
from troupe.actors.core.ngram_proposer import NgramIndex
from troupe.actors.core.queue_policy import QueuePolicy
from troupe.messages.common import FinishReason
from troupe.messages.sampling import SamplingParams
from troupe.messages.scheduler import AdmittedRequest
from troupe.messages.streamer import SeqOutput


class Status(enum.IntEnum):
    WAITING = 0  # no blocks (new, or preempted for recompute)
    RUNNING = 1  # blocks on the GPU
    SWAPPED = 2  # blocks in the CPU pool
    FINISHED = 3
    AWAITING = 4  # computed, its token late (disaggregation: late_tokens.py); holds its blocks


class Kind(enum.Enum):
    RUN = "run"  # running already: a decode or a prefill chunk, growing by `need` blocks
    NEW = "new"  # AllocateNew (first start or recompute): the grant is the whole table
    SWAP_IN = "swap_in"  # back from the CPU pool: the grant is the whole table
    FORK = "fork"  # a sample forked from its parent (sample_fork.py): the grant is the table


class Work(msgspec.Struct):
    """One request's planned share of a step (the step planner's typed entry)."""

    req: Request
    num_tokens: int
    kind: Kind
    need: int = 0  # GPU blocks counted for it (Grow; the reservation of NEW and SWAP_IN)
    draft: tuple[int, ...] = ()  # proposals to verify (a decode: num_tokens = 1 + len(draft))
    num_dropped: int = 0  # trailing blocks a Shrink takes back first
    held: bool = False  # its prompt's last token waits for the next step (step_planner.py)


@dataclass(slots=True, eq=False)  # eq=False: queues find and remove requests by identity
class Request:
    """Mutable scheduler-side state of one request (never leaves the scheduler)."""

    request_id: str
    params: SamplingParams
    token_ids: list[int]
    prompt_len: int
    max_total_tokens: int  # prompt + max_tokens, capped by max_model_len
    arrival_seq: int
    stop_ids: frozenset[int]
    sort_key: tuple[int, ...] = ()  # the queue policy's, fixed while queued
    status: Status = Status.WAITING
    num_computed: int = 0  # tokens whose KV is in the request's blocks (GPU or CPU)
    num_blocks: int = 0  # positions of its GPU table (counted from its grants)
    # of those, released ones behind a window (after the sink blocks when streaming)
    num_released: int = 0
    num_shared: int = 0  # of the held ones, blocks others hold too (allocator-reported)
    num_cpu_blocks: int = 0  # while swapped
    num_committed_blocks: int = 0  # leading blocks the allocator has cached/hashed
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache (first start)
    in_allocator: bool = False  # the allocator holds blocks for it (or an op is in flight)
    in_executor: bool = False  # the executor holds its state (params sent)
    needs_reset: bool = True  # next SeqWork replaces the executor's block table
    draft: tuple[int, ...] = ()  # proposals in the step in flight
    proposed: tuple[int, ...] = ()  # the draft model's proposals after its last token
    spec_rate: float = 1.0  # acceptance rate of its proposals (speculator.py)
    spec_paused: int = 0  # decode steps left without proposals (speculator.py backoff)
    ngrams: NgramIndex | None = None  # its n-grams' positions, made at its first proposal
    num_samples: int = 1  # > 1: a parent of parallel samples, not forked yet (sample_fork.py)
    late_step: int = 0  # while AWAITING: the step whose token it awaits
    # StreamingLLM (SamplingParams.streaming_window): the window, 0 when off, and the sinks
    stream_window: int = 0
    num_sink_tokens: int = 0
    decode: Work = field(init=False)  # its plan entry for a decode that needs no new block

    @classmethod
    def admit(cls, msg: AdmittedRequest, arrival_seq: int, eos_ids: frozenset[int]) -> Request:
        eos = frozenset() if msg.params.ignore_eos else eos_ids
        prompt = msg.prompt_token_ids
        args = (msg.request_id, msg.params, list(prompt), len(prompt), msg.max_total_tokens)
        req = cls(*args, arrival_seq, eos | frozenset(msg.params.stop_token_ids))
        req.decode = Work(req, 1, Kind.RUN)
        req.num_samples = msg.params.num_samples
        if msg.params.is_streaming:
            req.stream_window = msg.params.streaming_window or 0
            req.num_sink_tokens = msg.params.sink_tokens or 0
        return req

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def append_token(self, token_id: int) -> FinishReason | None:
        """Append one sampled token; the finish reason if it ends the request (STOP: it is a
        stop token; LENGTH: max_total_tokens reached)."""
        tokens = self.token_ids
        tokens.append(token_id)
        if token_id in self.stop_ids:
            return FinishReason.STOP
        if len(tokens) >= self.max_total_tokens:
            return FinishReason.LENGTH
        return None

    def failed(self, message: str) -> SeqOutput:
        """Its terminal output when it fails with `message`."""
        return SeqOutput(
            self.request_id, (), FinishReason.ERROR, None, None, self.num_cached_tokens, message
        )

    @property
    def compute_end(self) -> int:
        """Tokens it computes before sampling: all, but a parent stops before its last one."""
        return len(self.token_ids) - (self.num_samples > 1)


class RequestQueues:
    """Live requests by id, in four queues sorted by `sort_key`; ended requests whose blocks
    (`to_free`) or executor state (`released`) the next step releases."""

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self.requests: dict[str, Request] = {}
        queued = (Status.WAITING, Status.RUNNING, Status.SWAPPED, Status.AWAITING)
        self._queues: dict[Status, list[Request]] = {status: [] for status in queued}
        # awaiting (a late token): a seat and blocks, never planned nor a preemption victim
        self.waiting, self.running, self.swapped, self.awaiting = self._queues.values()
        self.to_free: dict[str, Request] = {}
        self.released: list[str] = []

    def add(self, req: Request) -> None:
        req.sort_key = self.policy.sort_key(req)
        self.enqueue(req, Status.WAITING)  # first: it may raise (keys that do not compare)
        self.requests[req.request_id] = req

    def enqueue(self, req: Request, status: Status) -> None:
        req.status = status
        bisect.insort(self._queues[status], req, key=attrgetter("sort_key"))

    def move(self, req: Request, status: Status) -> None:
        self._queues[req.status].remove(req)
        self.enqueue(req, status)

    def finish(self, req: Request) -> None:
        """End a request: out of its queue; blocks and executor state released next step."""
        if req.status != Status.FINISHED:
            self._queues[req.status].remove(req)
            req.status = Status.FINISHED
            del self.requests[req.request_id]
            if req.in_allocator:
                self.to_free[req.request_id] = req
            if req.in_executor:
                self.released.append(req.request_id)

    def recompute(self, req: Request) -> None:
        """Back to waiting with nothing computed (its blocks are freed)."""
        req.num_computed = req.num_committed_blocks = req.num_cpu_blocks = 0
        self.move(req, Status.WAITING)

    def find(self, request_id: str) -> Request | None:
        """A request the allocator may hold blocks for: live, or ended and not yet freed."""
        return self.requests.get(request_id) or self.to_free.get(request_id)
