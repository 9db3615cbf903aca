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

    split, extras only fill the cache: N+2 of the decodes and the chunks in one forward
                                       (gpu/overlap_merge.py; where it cannot: N+2 early,
                                       then the chunks)
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
from troupe.gpu.early_launch import fed_decode_inputs, launchable, matching_rows, split_rows
from troupe.gpu.overlap_merge import mergeable, merged_chunks
from troupe.gpu.readback import Readback
from troupe.gpu.request_states import RequestState, RequestStates
from troupe.gpu.sampler import WITHHELD, sample, sampled_tokens, withhold_non_finite
from troupe.gpu.sampling_batch import SamplingBatches
from troupe.gpu.step_inputs import StepInputs, concat_inputs
from troupe.messages import SampledToken, SeqWork, StepPlan

# The runner's forward: logits (model.logits_dtype) of the sampled rows; the tensor, when given, replaces
# inputs.input_ids with ids already on the device.
Forward = Callable[[StepInputs, torch.Tensor | None], torch.Tensor]
# A test seam (ModelRunner's logits_hook): called with the request ids of the rows and their
# logits [rows, vocab] right before sampling; it may change the logits in place.
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
    # their copy to the host, queued right after sampling (WITHHELD where a row's logits were
    # not finite: sampler.withhold_non_finite)
    readback: Readback
    input_tokens: list[int] = dataclasses.field(default_factory=list)  # per row: token fed

    def device_ids(self, rows: list[int]) -> torch.Tensor:
        """The samples of `rows` on the device (all of them: no gather)."""
        if len(rows) == len(self.rows):
            return self.token_ids
        return self.token_ids[host_to_device(np.asarray(rows), self.token_ids.device)]

    def read(self) -> list[int]:
        """The sampled ids on the host; waits for this step only, not for work queued later."""
        return self.readback.read()


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
        block_size: int,
        max_model_len: int,
        batches: SamplingBatches,
        logits_hook: LogitsHook | None = None,
        merge_chunks: bool = True,
    ) -> None:
        self._states = states
        self.merge_chunks = merge_chunks  # splits whose chunks sample nothing: one forward
        self._forward = forward
        self._logits_hook = logits_hook
        self.block_size = block_size
        self.max_model_len = max_model_len
        self._batches = batches  # the runner's: a run of decodes keeps its settings uploaded
        self.num_overlapped = 0  # decode steps launched before their plan arrived
        self.num_overlap_hits = 0  # ... whose plan matched, so their samples were used
        self.num_overlap_splits = 0  # ... hits whose plan had more work besides (Split)
        self.num_overlap_merges = 0  # ... splits whose chunks joined the next decode step
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
        split = split_rows(plan.seqs, pending.rows, pending.input_tokens, pending.positions)
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
            following = self._launch(states, next_pos, request_ids, pending.device_ids(rows))
        launched = pending.read()  # waits for the overlapped step's samples
        token_ids = [launched[r] for r in rows]
        if early:
            if following is not None:
                following.input_tokens = token_ids
        elif WITHHELD not in token_ids:  # a failed row has no token to feed: run the plan
            following = self._launch(states, next_pos, request_ids, token_ids)
        self._pending = following
        return request_ids, token_ids

    def _split(
        self, plan: StepPlan, pending: _PendingStep, rows: list[int]
    ) -> Split | tuple[SampledToken, ...]:
        """The leading len(rows) SeqWorks are the pending step's decodes; the rest are new.
        Chunks that sample nothing join the decodes' next step where they can: the answer is
        then the decodes' tokens, as for a hit (overlap_merge.py)."""
        decodes, extras = plan.seqs[: len(rows)], plan.seqs[len(rows) :]
        self.num_overlap_splits += 1
        next_pos = pending.positions[rows] + 1
        if not any(w.sample or w.num_scored or w.pools for w in extras):  # only cache fills
            if self.merge_chunks:
                num_blocks = mergeable(
                    decodes, self._states, next_pos, self.block_size, self.max_model_len
                )
                if num_blocks is not None:
                    return self._merge(plan, pending, rows, next_pos, num_blocks)
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
            next_pos=next_pos,
            extras=extras,
            launched=False,
        )

    def _merge(
        self,
        plan: StepPlan,
        pending: _PendingStep,
        rows: list[int],
        next_pos: np.ndarray,
        num_blocks: np.ndarray,
    ) -> tuple[SampledToken, ...]:
        """The decodes' answer from the pending step; their next step and the plan's chunks
        (held-back tokens sampled ahead) launched as one forward, now pending."""
        decodes, extras = plan.seqs[: len(rows)], plan.seqs[len(rows) :]
        if plan.released:
            self._states.release(plan.released)
        states = self._states.apply(decodes)
        decode_inputs = fed_decode_inputs(
            states, next_pos, num_blocks, None, self._states, self.block_size
        )
        chunks = merged_chunks(extras, self._states, self.block_size)
        request_ids = [w.request_id for w in decodes]
        merged = self._sampled_step(
            concat_inputs(decode_inputs, chunks.inputs),
            states + chunks.states,
            request_ids + chunks.request_ids,
            np.concatenate([next_pos, chunks.positions]),
            pending.device_ids(rows),
        )
        self.num_overlap_hits += 1
        self.num_overlap_merges += 1
        launched = pending.read()  # waits for the pending step's samples
        token_ids = [launched[r] for r in rows]
        merged.input_tokens = token_ids + chunks.fed
        self._pending = merged
        return sampled_tokens(request_ids, token_ids, [None] * len(token_ids))

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
        num_blocks = launchable(states, next_pos, self.block_size, self.max_model_len)
        if num_blocks is None:
            return None
        device_ids = None if isinstance(token_ids, list) else token_ids
        host_ids = token_ids if isinstance(token_ids, list) else None
        inputs = fed_decode_inputs(
            states, next_pos, num_blocks, host_ids, self._states, self.block_size
        )
        step = self._sampled_step(inputs, states, request_ids, next_pos, device_ids)
        step.input_tokens = token_ids if isinstance(token_ids, list) else []
        return step

    def _sampled_step(
        self,
        inputs: StepInputs,
        states: list[RequestState],
        request_ids: list[str],
        positions: np.ndarray,
        device_ids: torch.Tensor | None,
    ) -> _PendingStep:
        """Queue the forward of `inputs` (its leading ids `device_ids`, when given), sampling
        of its rows (one per state) and the copy of their samples to the host; no wait."""
        logits = self._forward(inputs, device_ids)
        if self._logits_hook is not None:
            with torch.inference_mode():  # the logits are inference tensors: edits need it
                self._logits_hook(request_ids, logits)
        batch = self._batches.build(states)
        ids_device, _ = sample(logits, batch)  # no logprobs asked: nothing is read back
        # The next step is fed ids_device (real tokens); only the read-back copy marks failures.
        readback = Readback(withhold_non_finite(ids_device, logits))
        self.num_overlapped += 1
        return _PendingStep(
            rows={rid: i for i, rid in enumerate(request_ids)},
            positions=positions,
            token_ids=ids_device,
            readback=readback,
        )
