"""One request as the scheduler sees it: tokens, progress, blocks, and where it lives."""

from __future__ import annotations

import enum

from troupe.messages.common import FinishReason
from troupe.messages.sampling import SamplingParams
from troupe.messages.scheduler import AdmittedRequest


class Status(enum.IntEnum):
    WAITING = 0  # no blocks (new, or preempted for recompute)
    RUNNING = 1  # blocks on the GPU
    SWAPPED = 2  # blocks in the CPU pool
    FINISHED = 3


class Request:
    """Mutable scheduler-side state of one request (never leaves the scheduler)."""

    __slots__ = (
        "arrival_seq",
        "in_allocator",
        "in_executor",
        "max_total_tokens",
        "needs_reset",
        "num_cached_tokens",
        "num_committed_blocks",
        "num_computed",
        "num_cpu_blocks",
        "params",
        "priority",
        "prompt_len",
        "request_id",
        "sort_key",
        "status",
        "stop_ids",
        "table",
        "token_ids",
    )

    def __init__(self, msg: AdmittedRequest, arrival_seq: int, eos_token_ids: frozenset[int]):
        self.request_id = msg.request_id
        self.params: SamplingParams = msg.params
        self.token_ids: list[int] = list(msg.prompt_token_ids)
        self.prompt_len = len(msg.prompt_token_ids)
        self.max_total_tokens = msg.max_total_tokens
        self.priority = msg.params.priority
        self.arrival_seq = arrival_seq
        # Higher priority first, then first come first served: the scheduling order. The victim
        # of a preemption is the last in this order (lowest priority, latest arrival).
        self.sort_key = (-self.priority, arrival_seq)
        eos = frozenset() if msg.params.ignore_eos else eos_token_ids
        self.stop_ids = eos | frozenset(msg.params.stop_token_ids)
        self.status = Status.WAITING
        self.num_computed = 0  # tokens whose KV is in the request's blocks (GPU or CPU)
        self.table: list[int] = []  # GPU block ids (mirror of the allocator's table)
        self.num_cpu_blocks = 0  # while swapped
        self.num_committed_blocks = 0  # leading blocks the allocator has cached/hashed
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache (first start)
        self.in_allocator = False  # the allocator holds blocks for it (or an op is in flight)
        self.in_executor = False  # the executor holds its state (params sent)
        self.needs_reset = True  # next SeqWork replaces the executor's block table

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_remaining(self) -> int:
        """Tokens still to compute before the next token can be sampled."""
        return len(self.token_ids) - self.num_computed

    def append(self, token_id: int) -> tuple[FinishReason | None, int | None]:
        """Append a sampled token; (finish reason, stop token id) if it ends the request."""
        self.token_ids.append(token_id)
        if token_id in self.stop_ids:
            return FinishReason.STOP, token_id
        if len(self.token_ids) >= self.max_total_tokens:
            return FinishReason.LENGTH, None
        return None, None

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, tokens={len(self.token_ids)}, "
            f"computed={self.num_computed}, blocks={len(self.table)})"
        )
