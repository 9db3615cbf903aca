"""Per-request executor state, kept between steps and updated by each StepPlan's deltas.

Block tables live in one slot-indexed array so that a step gathers all its tables with one
fancy index instead of a copy per sequence:

    tables[slot] = [b0 b1 b2 0 0 ...]      num_blocks = 3; entries past num_blocks stay 0
    state.block_table is a view of tables[slot]

Sampling settings are folded into one float row per request (`param_row`) when params arrive,
so the sampling batch is one np.stack per step. Token history is kept only for requests with
a penalty or a multi-token bad word: nothing else reads it, and writing it is per-sequence
work on every decode step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np
from troupe.gpu.logit_edits import RequestEdits, request_edits
from troupe.messages import SamplingParams, SeqWork

# columns of RequestState.param_row
TEMPERATURE, TOP_K, TOP_P, MIN_P, PRESENCE, FREQUENCY, REPETITION, LOGPROBS = range(8)
NUM_PARAM_COLUMNS = 8


def param_row(params: SamplingParams) -> np.ndarray:
    """float64 [8]: the columns above; top_k 0 when off, logprobs -1 when not asked."""
    return np.array(
        [
            params.temperature,
            max(params.top_k, 0),
            params.top_p,
            params.min_p,
            params.presence_penalty,
            params.frequency_penalty,
            params.repetition_penalty,
            -1 if params.logprobs is None else params.logprobs,
        ],
        dtype=np.float64,
    )


@dataclasses.dataclass(kw_only=True, eq=False)
class RequestState:
    """What the executor remembers of a request between steps."""

    params: SamplingParams
    seed: int
    block_table: np.ndarray  # int32 [max_blocks_per_seq]; the first num_blocks are live
    num_blocks: int = 0
    tokens: np.ndarray | None = None  # int64 [max_model_len]; only when params need history
    num_tokens: int = 0  # positions 0..num_tokens-1 are known
    num_prompt_tokens: int = 0
    slot: int = -1  # row of RequestStates.tables; -1 when standalone (tests)
    adapter: int = -1  # its LoRA adapter's id (RequestStates.adapter_ids); -1: none
    eos_token_ids: tuple[int, ...] = ()  # what min_tokens bans besides stop_token_ids
    param_row: np.ndarray = dataclasses.field(init=False)
    edits: RequestEdits | None = dataclasses.field(init=False)  # logit_bias, min_tokens

    def __post_init__(self) -> None:
        self.param_row = param_row(self.params)
        self.edits = request_edits(self.params, self.eos_token_ids)

    @property
    def wants_logprobs(self) -> bool:
        """Whether its samples' logprobs are asked for (per step: an attribute, not the float
        row's column, which costs a numpy scalar per request)."""
        return self.params.logprobs is not None

    def set_params(self, params: SamplingParams, max_model_len: int) -> None:
        self.params = params
        self.param_row = param_row(params)
        self.edits = request_edits(params, self.eos_token_ids)
        if self.tokens is None and params.needs_history:
            self.tokens = np.zeros(max_model_len, dtype=np.int64)


class RequestStates:
    """All live requests' states, keyed by request id, with their tables in one array."""

    def __init__(
        self,
        *,
        max_model_len: int,
        max_blocks_per_seq: int,
        block_size: int,
        new_seed: Callable[[], int],
        capacity: int = 256,
        eos_token_ids: tuple[int, ...] = (),
        adapter_ids: Mapping[str, int] | None = None,
    ) -> None:
        """`adapter_ids`: the LoRA adapters' ids by name (gpu/lora_runtime.py); None: the
        engine has none."""
        self.adapter_ids = adapter_ids
        self.has_adapters = adapter_ids is not None
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.max_blocks_per_seq = max_blocks_per_seq
        self.block_size = block_size
        self._new_seed = new_seed
        self.tables = np.zeros((max(capacity, 1), max_blocks_per_seq), dtype=np.int32)
        self._free_slots = list(range(len(self.tables) - 1, -1, -1))
        self.by_id: dict[str, RequestState] = {}

    def __len__(self) -> int:
        return len(self.by_id)

    def release(self, request_ids: tuple[str, ...]) -> None:
        for request_id in request_ids:
            state = self.by_id.pop(request_id, None)
            if state is not None:
                self.tables[state.slot] = 0
                self._free_slots.append(state.slot)

    def clear(self) -> None:
        self.release(tuple(self.by_id))

    def apply(self, seqs: tuple[SeqWork, ...]) -> list[RequestState]:
        """Fold each SeqWork's delta (blocks, params, tokens) into its request's state."""
        by_id = self.by_id
        out = []
        for work in seqs:
            state = by_id.get(work.request_id)
            if state is None:
                state = self._create(work)
            elif work.params is not None:
                state.set_params(work.params, self.max_model_len)
            num_new = len(work.token_ids)
            end = work.start_pos + num_new
            if work.block_ids or work.reset or work.num_dropped_blocks:
                self._add_blocks(state, work)
            if work.draft_token_ids:  # proposals: their KV and history after the token
                self._add_drafts(state, work, end)
            if state.tokens is not None:
                if work.history:  # moved in from another executor (disaggregation)
                    state.tokens[: len(work.history)] = work.history
                if end > self.max_model_len:
                    self._check_fail(work, state)
                state.tokens[work.start_pos : end] = work.token_ids
            state.num_tokens = end
            if work.num_prompt_tokens:
                state.num_prompt_tokens = work.num_prompt_tokens
            if state.edits is not None:  # what it kept of the tokens rewritten here is stale
                first = 0 if work.history or work.reset else work.start_pos
                state.edits.rewritten(first - state.num_prompt_tokens)
            out.append(state)
        self._check(seqs, out)
        return out

    def _create(self, work: SeqWork) -> RequestState:
        if work.params is None:
            raise ValueError(f"request {work.request_id!r}: first SeqWork carries no params")
        seed = work.params.seed if work.params.seed is not None else self._new_seed()
        if not self._free_slots:
            self._grow()
        slot = self._free_slots.pop()
        state = RequestState(
            params=work.params,
            seed=int(seed),
            block_table=self.tables[slot],
            slot=slot,
            eos_token_ids=self.eos_token_ids,
        )
        state.set_params(work.params, self.max_model_len)
        if work.params.lora is not None:
            if self.adapter_ids is None or work.params.lora not in self.adapter_ids:
                raise ValueError(
                    f"request {work.request_id!r}: no LoRA adapter {work.params.lora!r} here"
                )
            state.adapter = self.adapter_ids[work.params.lora]
        self.by_id[work.request_id] = state
        return state

    def _add_drafts(self, state: RequestState, work: SeqWork, end: int) -> None:
        """Proposals are written at end.. (history rewritten by position later, like all)."""
        last = end + len(work.draft_token_ids)
        if last > self.max_model_len or -(-last // self.block_size) > state.num_blocks:
            raise ValueError(
                f"request {work.request_id!r}: {len(work.draft_token_ids)} proposals after "
                f"position {end - 1} pass max_model_len {self.max_model_len} or its "
                f"{state.num_blocks} blocks"
            )
        if state.tokens is not None:
            state.tokens[end:last] = work.draft_token_ids

    def _add_blocks(self, state: RequestState, work: SeqWork) -> None:
        first = 0 if work.reset else state.num_blocks - work.num_dropped_blocks
        if first < 0:
            raise ValueError(f"request {work.request_id!r}: drops more blocks than it holds")
        last = first + len(work.block_ids)
        if last > self.max_blocks_per_seq:
            raise ValueError(
                f"request {work.request_id!r}: {last} blocks exceed "
                f"max_model_len / block_size = {self.max_blocks_per_seq}"
            )
        table = state.block_table
        table[first:last] = work.block_ids
        if last < state.num_blocks:
            table[last : state.num_blocks] = 0  # a reset to a shorter table: no stale ids
        state.num_blocks = last

    def _check(self, seqs: tuple[SeqWork, ...], states: list[RequestState]) -> None:
        """Vectorised limits: positions within max_model_len, enough blocks for the tokens."""
        ends = np.fromiter((s.num_tokens for s in states), np.int64, len(states))
        blocks = np.fromiter((s.num_blocks for s in states), np.int64, len(states))
        bad = (ends > self.max_model_len) | (-(-ends // self.block_size) > blocks)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            self._check_fail(seqs[row], states[row])

    def _check_fail(self, work: SeqWork, state: RequestState) -> None:
        end = work.start_pos + len(work.token_ids)
        if end > self.max_model_len:
            raise ValueError(
                f"request {work.request_id!r}: position {end - 1} is past max_model_len "
                f"{self.max_model_len}"
            )
        needed = -(-end // self.block_size)
        raise ValueError(
            f"request {work.request_id!r}: {end} tokens need {needed} blocks, "
            f"its table has {state.num_blocks}"
        )

    def _grow(self) -> None:
        """Double the slot array (requests swapped out keep their state, so it can pass
        max_num_seqs); the states' table views move to the new array."""
        old = self.tables
        self.tables = np.zeros((2 * len(old), old.shape[1]), dtype=np.int32)
        self.tables[: len(old)] = old
        self._free_slots.extend(range(len(self.tables) - 1, len(old) - 1, -1))
        for state in self.by_id.values():
            state.block_table = self.tables[state.slot]
