"""What the client side receives: stream events per request, and engine stats.

Every request gets zero or more `Delta`s, then exactly one terminal event: `Finished`,
`Rejected`, `Aborted` or `Failed`.

Parallel sampling (SamplingParams.n / best_of): events carry the sample's `index`, and each
sample ends with exactly one `Finished`, `Aborted` or `Failed`; `samples_left` counts the
request's samples still open after it, so the request's terminal event (`is_terminal`) is the
end of its last sample. A request refused before it ran gets one `Rejected`, as always.
"""

from __future__ import annotations

import enum
from typing import ClassVar

import msgspec
from troupe.messages.common import FinishReason, RejectCode, Timings, TokenLogprob, Usage


class Delta(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    request_id: str
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: None = None
    index: int = 0  # the sample (parallel sampling)
    prompt_tokens: int | None = None  # on a request's first Delta: its prompt's token count
    # SamplingParams.prompt_logprobs, on a request's first event: prompt positions 1.. in order
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    embedding: tuple[float, ...] | None = None  # SamplingParams.pooling, on the first event
    # SamplingParams.return_prompt_token_ids, on the first event
    prompt_token_ids: tuple[int, ...] | None = None

    is_terminal: ClassVar[bool] = False


class Finished(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Normal end. Carries the last delta (possibly empty) as well."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason  # STOP or LENGTH
    usage: Usage
    timings: Timings
    # the stop string or stop token id that matched; None at the model's EOS (vLLM's)
    stop_reason: str | int | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None
    index: int = 0
    samples_left: int = 0  # the request's samples still open after this one ends
    # what the request asked for (its SamplingParams' n and max_tokens): vLLM's request_params_*
    params_n: int = 1
    params_max_tokens: int | None = None
    cumulative_logprob: float | None = None  # best_of: the sum it was ranked by
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None  # when it is the first event
    embedding: tuple[float, ...] | None = None  # likewise
    prompt_token_ids: tuple[int, ...] | None = None  # likewise

    @property
    def is_terminal(self) -> bool:
        return self.samples_left == 0


class Rejected(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Turned away before running; `field` names the offending field when there is one."""

    request_id: str
    code: RejectCode
    message: str
    field: str | None = None
    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: str = "rejected"

    is_terminal: ClassVar[bool] = True


class Aborted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    request_id: str
    reason: str
    usage: Usage
    timings: Timings
    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: FinishReason = FinishReason.ABORT
    index: int = 0
    samples_left: int = 0

    @property
    def is_terminal(self) -> bool:
        return self.samples_left == 0


class FailureCause(enum.StrEnum):
    """Whose fault a Failed is: the engine's (a fault, an HTTP 500), or the client's request."""

    INTERNAL = "internal"
    # its grammar allows no token after the text so far (actors/core/grammar.py): a 400
    GRAMMAR_DEAD_END = "grammar_dead_end"


class Failed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    request_id: str
    message: str
    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: FinishReason = FinishReason.ERROR
    index: int = 0
    samples_left: int = 0
    cause: FailureCause = FailureCause.INTERNAL  # a default, so older traces still decode

    @property
    def is_terminal(self) -> bool:
        return self.samples_left == 0


StreamEvent = Delta | Finished | Rejected | Aborted | Failed


# Upper bounds of the steps' token counts that EngineStats.steps_by_tokens counts steps under
# (vLLM's iteration_tokens_total buckets); a last count is for steps above the largest.
STEP_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class EngineStats(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A snapshot the scheduler publishes after each step (and after frees when idle)."""

    num_gpu_blocks: int = 0
    num_gpu_blocks_used: int = 0  # owned by a request
    num_gpu_blocks_cached: int = 0  # free but holding reusable prefix KV
    num_cpu_blocks: int = 0
    num_cpu_blocks_used: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_preemptions_swap: int = 0
    num_preemptions_recompute: int = 0
    prefix_cache_hit_tokens: int = 0
    prefix_cache_query_tokens: int = 0
    prefix_cache_cpu_hit_tokens: int = 0  # of the hits, those served by the CPU tier
    num_steps: int = 0
    # Speculative decoding: tokens proposed and accepted, and how many verifications accepted
    # 0, 1, ... k proposals (index = accepted length).
    num_spec_proposed_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    spec_accepted_lengths: tuple[int, ...] = ()
    # LoRA: the most adapters one step runs (0: the engine serves none), and the adapters
    # (sorted names) of the running requests and of those queued to run (waiting or swapped),
    # always empty when it serves none (not counted then).
    max_loras: int = 0
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()
    # Tokens each planned step computes (prompt chunks, decodes and proposals to verify): steps
    # per STEP_TOKEN_BUCKETS bound (not cumulative; empty before the first step), and the sum.
    steps_by_tokens: tuple[int, ...] = ()
    num_step_tokens: int = 0

    @property
    def num_gpu_blocks_free(self) -> int:
        return self.num_gpu_blocks - self.num_gpu_blocks_used

    @property
    def num_cpu_blocks_free(self) -> int:
        return self.num_cpu_blocks - self.num_cpu_blocks_used


class StreamBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Streamer -> engine edge, one per TokenBatch: events for many requests, latest stats."""

    events: tuple[StreamEvent, ...]
    stats: EngineStats | None = None


ClientInbox = StreamBatch
