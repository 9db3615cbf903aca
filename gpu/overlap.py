"""Overlap scheduling: the next decode step launched before its plan arrives.

On CUDA when EngineConfig.enable_overlap_schedule (the default). When a step samples every
sequence it ran, the runner launches the next decode step of those sequences right away,
before its plan arrives, so the GPU computes while the actors plan:

    execute(plan N):   forward N, sample N, tolist | launch N+1 (inputs: N's samples, pos + 1)
    actors:                                         | update, plan, allocate  (GPU busy on N+1)
    execute(plan N+1): plan is "the same step"? yes: launch N+2 fed N+1's ids on the device,
                                                     then read N+1's ids (copied before N+2)
                                                no:  discard N+1, run plan N+1 normally

A plan that is the pending step plus work the pending step does not have (a prefill chunk
joining, or a new request) is a split: the pending samples answer its decodes, and the runner
runs only the rest. Without it such a mixed step would throw the pending decode away and
recompute it, with the actors' planning no longer hidden behind the GPU:

    split, extras only fill the cache: launch N+2 of the decodes early, then the chunk
    split, extras sample:              run the extras, then launch N+2 of decodes and extras

The scheduler gives decodes one lookahead position (num_lookahead_tokens), so the runner owns
the KV slot the overlapped step writes. This is not speculative decoding: every token is
sampled from the same distribution as without overlap, one step at a time; only when the step
runs changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import torch
from troupe.gpu.device_inputs import host_to_device
from troupe.gpu.request_states import LOGPROBS, RequestState, RequestStates
from troupe.gpu.sampler import WITHHELD, sample, sampled_tokens, withhold_non_finite
from troupe.gpu.sampling_batch import build_sampling_batch
from troupe.gpu.step_inputs import StepInputs, build_decode_inputs
from troupe.messages import SampledToken, SeqWork, StepPlan

# The runner's forward: fp32 logits of the sampled rows; the tensor, when given, replaces
# inputs.input_ids with ids already on the device.
Forward = Callable[[StepInputs, torch.Tensor | None], torch.Tensor]
# A test seam (ModelRunner's logits_hook): called with the request ids of the rows and their
# fp32 logits [rows, vocab] right before sampling; it may change the logits in place.
LogitsHook = Callable[[Sequence[str], torch.Tensor], None]


@dataclasses.dataclass(kw_only=True, eq=False)
class Split:
    """A plan the pending step answers in part: its leading decodes got `token_ids` from it; the
    runner runs `extras` and, unless `launched`, launches the next decode of both."""

    request_ids: list[str]  # the decodes answered, in plan order
    token_ids: list[int]  # their samples (WITHHELD where logits were not finite)
    states: list[RequestState]
    next_pos: np.ndarray  # int64: the position each decode's next step computes
    extras: tuple[SeqWork, ...]  # the rest of the plan, none of it in the pending step
    launched: bool  # the decodes' next step is already queued (the extras do not sample)


@dataclasses.dataclass(kw_only=True, eq=False)
class _PendingStep:
    """A decode step launched before its plan arrived; its samples are still on the device."""

    rows: dict[str, int]  # request id -> row of the launched batch
    positions: np.ndarray  # int64 per row: the position the step computes
    token_ids: torch.Tensor  # int64 [rows] on the device: not read back yet
    host_ids: torch.Tensor  # their copy to (pinned) host memory, queued right after sampling
    # (WITHHELD where a row's logits were not finite: sampler.withhold_non_finite)
    copied: torch.cuda.Event | None  # recorded after that copy; None on the CPU
    input_tokens: list[int] = dataclasses.field(default_factory=list)  # per row: token fed

    def read(self) -> list[int]:
        """The sampled ids on the host; waits for this step only, not for work queued later."""
        if self.copied is not None:
            self.copied.synchronize()
        out: list[int] = self.host_ids.tolist()
        return out


class DecodeOverlap:
    """Owns the pending overlapped step: launches it, and answers the next plan from it.

    The runner calls `take(plan)` first on every plan: a tuple (possibly empty) is the plan's
    answer; None means the runner runs the plan itself (nothing pending, or a miss: the
    pending step is discarded). After a normal step that sampled every sequence, the runner
    calls `launch(...)`. `discard()` drops the pending step (stream order keeps its KV writes
    before anything queued later).
    """

    def __init__(
        self,
        states: RequestStates,
        forward: Forward,
        *,
        device: torch.device,
        block_size: int,
        max_model_len: int,
        vocab_size: int,
        logits_hook: LogitsHook | None = None,
    ) -> None:
        self._states = states
        self._forward = forward
        self._logits_hook = logits_hook
        self.device = device
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.num_overlapped = 0  # decode steps launched before their plan arrived
        self.num_overlap_hits = 0  # ... whose plan matched, so their samples were used
        self.num_overlap_splits = 0  # ... hits whose plan had more work besides (Split)
        self._pending: _PendingStep | None = None

    def take(self, plan: StepPlan) -> tuple[SampledToken, ...] | Split | None:
        """The plan's tokens from the pending step; a Split: its decodes' tokens, the runner
        runs the rest; None: the runner must run the plan."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        if not plan.seqs and not plan.swap_out and not plan.swap_in and not plan.copy_blocks:
            # Only releases: the overlapped step is still the next one to run.
            self._states.release(plan.released)
            self._pending = pending
            return ()
        if plan.swap_out or plan.swap_in or plan.copy_blocks:
            return None
        rows = matching_rows(plan.seqs, pending.rows, pending.input_tokens, pending.positions)
        if rows is not None:
            return self._take(plan, pending, rows)
        split = _split_rows(plan.seqs, pending)
        if split is not None:
            return self._split(plan, pending, split)
        # Discard. The overlapped step only wrote KV at position pos+1 of each of its
        # requests, in blocks their tables own (the lookahead). A request that continues
        # computes that slot again in this plan or a later one, with the same token and
        # context: the same value. A request that ended never reads it, and the block is
        # not full of committed tokens, so the prefix cache never hands it out; when the
        # block is reused, its new owner writes a slot before reading it. Everything the
        # runner does next (swap copies included) runs on the same CUDA stream after the
        # overlapped step, so a swap-out reads its blocks after that write and a reused
        # block is written after it. Its samples are dropped; the state it advanced
        # (num_tokens, history at pos+1) is rewritten by this plan's SeqWorks,
        # position-indexed and idempotent.
        return None

    def launch(
        self,
        states: list[RequestState],
        next_pos: np.ndarray,
        request_ids: list[str],
        token_ids: list[int],
    ) -> None:
        """Launch the decode of the just-sampled `token_ids` at `next_pos`, one per state."""
        self._pending = self._launch(states, next_pos, request_ids, token_ids)

    def discard(self) -> None:
        """Drop the pending step; stream order keeps its KV writes before later work."""
        self._pending = None

    def _take(
        self, plan: StepPlan, pending: _PendingStep, rows: list[int]
    ) -> tuple[SampledToken, ...]:
        """The plan is the overlapped step (or a subset of it): use its samples."""
        request_ids, token_ids = self._answer(plan.released, plan.seqs, pending, rows)
        return sampled_tokens(request_ids, token_ids, [None] * len(token_ids))

    def _answer(
        self,
        released: tuple[str, ...],
        seqs: tuple[SeqWork, ...],
        pending: _PendingStep,
        rows: list[int],
    ) -> tuple[list[str], list[int]]:
        """`seqs` are decodes the pending step computed: their ids and samples; the step after
        is launched (early, fed device ids, when no row keeps a penalty history)."""
        if released:
            self._states.release(released)  # ended requests drop out: samples discarded
        # The plan's block_ids are lookahead blocks for the step after; its tokens and
        # positions are what the overlapped step already wrote.
        states = self._states.apply(seqs)
        self.num_overlap_hits += 1
        next_pos = pending.positions[rows] + 1
        request_ids = [w.request_id for w in seqs]
        # Without penalties the following step needs no host copy of these samples: feed the
        # device ids and queue it before waiting, so the GPU goes from one step to the next.
        # Penalty history needs the tokens on the host first.
        early = all(s.tokens is None for s in states)
        following = None
        if early:
            device_ids = pending.token_ids
            if len(rows) != len(pending.rows):
                device_ids = device_ids[host_to_device(np.asarray(rows), self.device)]
            following = self._launch(states, next_pos, request_ids, device_ids)
        launched = pending.read()  # waits for the overlapped step's samples
        token_ids = [launched[r] for r in rows]
        if early:
            if following is not None:
                following.input_tokens = token_ids
        elif WITHHELD not in token_ids:  # a failed row has no token to feed: run the plan
            following = self._launch(states, next_pos, request_ids, token_ids)
        self._pending = following
        return request_ids, token_ids

    def _split(self, plan: StepPlan, pending: _PendingStep, rows: list[int]) -> Split:
        """The leading len(rows) SeqWorks are the pending step's decodes; the rest are new."""
        decodes, extras = plan.seqs[: len(rows)], plan.seqs[len(rows) :]
        self.num_overlap_splits += 1
        if not any(w.sample for w in extras):
            # The extras only fill the cache: the decodes' next step goes first, as in a hit.
            request_ids, token_ids = self._answer(plan.released, decodes, pending, rows)
            return Split(
                request_ids=request_ids,
                token_ids=token_ids,
                states=[],
                next_pos=np.empty(0, np.int64),
                extras=extras,
                launched=True,
            )
        if plan.released:
            self._states.release(plan.released)
        self.num_overlap_hits += 1
        launched = pending.read()
        return Split(
            request_ids=[w.request_id for w in decodes],
            token_ids=[launched[r] for r in rows],
            states=self._states.apply(decodes),
            next_pos=pending.positions[rows] + 1,
            extras=extras,
            launched=False,
        )

    def _launch(
        self,
        states: list[RequestState],
        next_pos: np.ndarray,
        request_ids: list[str],
        token_ids: list[int] | torch.Tensor,
    ) -> _PendingStep | None:
        """Queue the decode of `token_ids` (host list, or device ids with no penalty state) at
        `next_pos`, one per state, and the copy of its samples to the host; wait for nothing.

        None when a table does not cover its next position (no lookahead block yet), past
        max_model_len, or when a request wants logprobs (those are read back synchronously).
        """
        num_seqs = len(states)
        num_blocks = launchable(states, next_pos, self.block_size, self.max_model_len)
        if num_blocks is None:
            return None
        device_ids = None if isinstance(token_ids, list) else token_ids
        host_ids = token_ids if isinstance(token_ids, list) else None
        inputs = fed_decode_inputs(
            states, next_pos, num_blocks, host_ids, self._states.tables, self.block_size
        )
        logits = self._forward(inputs, device_ids)
        if self._logits_hook is not None:
            with torch.inference_mode():  # the logits are inference tensors: edits need it
                self._logits_hook(request_ids, logits)
        batch = build_sampling_batch(states, self.vocab_size, self.device)
        ids_device, _ = sample(logits, batch)  # no logprobs asked: nothing is read back
        # The next step is fed ids_device (real tokens); only the read-back copy marks failures.
        checked = withhold_non_finite(ids_device, logits)
        copied = None
        if self.device.type == "cuda":
            host = torch.empty(num_seqs, dtype=torch.int64, pin_memory=True)
            host.copy_(checked, non_blocking=True)
            copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
            copied.record()
        else:
            host = checked
        self.num_overlapped += 1
        return _PendingStep(
            rows={rid: i for i, rid in enumerate(request_ids)},
            positions=next_pos,
            token_ids=ids_device,
            host_ids=host,
            copied=copied,
            input_tokens=token_ids if isinstance(token_ids, list) else [],
        )


def launchable(
    states: list[RequestState], next_pos: np.ndarray, block_size: int, max_model_len: int
) -> np.ndarray | None:
    """Each state's block count if their next decode at `next_pos` may be launched early:
    None when a table does not cover its position (no lookahead block yet), past
    max_model_len, or when a request wants logprobs (those are read back synchronously)."""
    num_blocks = np.fromiter((s.num_blocks for s in states), np.int64, len(states))
    if (next_pos >= max_model_len).any() or (num_blocks * block_size <= next_pos).any():
        return None
    if any(s.param_row[LOGPROBS] >= 0 for s in states):
        return None
    return num_blocks


def fed_decode_inputs(
    states: list[RequestState],
    next_pos: np.ndarray,
    num_blocks: np.ndarray,
    token_ids: list[int] | None,
    tables: np.ndarray,
    block_size: int,
) -> StepInputs:
    """The inputs of a decode launched before its plan, fed `token_ids` from the host (None:
    ids already on the device, which only rows without penalty history take). The fed tokens
    join the history exactly as the next plan's SeqWorks will put them (a rewrite by
    position, so a discarded step leaves nothing wrong)."""
    num_seqs = len(states)
    for i, (state, pos) in enumerate(zip(states, next_pos.tolist(), strict=True)):
        state.num_tokens = pos + 1
        if state.tokens is not None:
            assert token_ids is not None, "penalty history needs the fed tokens on the host"
            state.tokens[pos] = token_ids[i]
    slots = np.fromiter((s.slot for s in states), np.int64, num_seqs)
    host_ids = np.zeros(num_seqs, np.int64) if token_ids is None else np.asarray(token_ids)
    return build_decode_inputs(
        host_ids.astype(np.int64, copy=False), next_pos, slots, num_blocks, tables, block_size
    )


def matching_rows(
    seqs: Sequence[SeqWork], rows: dict[str, int], tokens: list[int], positions: np.ndarray
) -> list[int] | None:
    """Rows of an early-launched batch (request id -> row, the token fed and the position of
    each row), in plan order, if the plan is that step.

    Each SeqWork must be a plain decode of a launched request, fed the token sampled for it
    with the position after, in the launch order; requests may drop out (they ended).
    """
    found = _leading_rows(seqs, rows, tokens, positions)
    return found if len(found) == len(seqs) else None


def _split_rows(seqs: Sequence[SeqWork], pending: _PendingStep) -> list[int] | None:
    """Rows of the leading decodes if the plan is a split: at least one of them, and none of
    the SeqWorks after them belongs to a request of the overlapped step."""
    rows = _leading_rows(seqs, pending.rows, pending.input_tokens, pending.positions)
    extras = seqs[len(rows) :]
    if not rows or any(
        w.request_id in pending.rows or w.draft_token_ids or w.num_dropped_blocks for w in extras
    ):
        return None  # proposals to verify run as a step of their own
    return rows


def _leading_rows(
    seqs: Sequence[SeqWork], launched: dict[str, int], fed: list[int], at: np.ndarray
) -> list[int]:
    """Rows of the longest prefix of `seqs` that the launched step computed as planned."""
    rows: list[int] = []
    previous = -1
    get, tokens, positions = launched.get, fed, at.tolist()
    for work in seqs:
        row = get(work.request_id)
        if (
            row is None
            or row <= previous
            or work.reset
            or not work.sample
            or work.params is not None
            or work.draft_token_ids  # a verification: its own step
            or work.num_dropped_blocks
            or len(work.token_ids) != 1
            or work.token_ids[0] != tokens[row]
            or work.start_pos != positions[row]
        ):
            break
        rows.append(row)
        previous = row
    return rows
