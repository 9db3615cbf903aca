"""Overlap for steps under grammar masks: the next step's forward launched before its plan.

A step of structured output cannot be sampled before the grammar actor has seen the tokens of
the step before it, so DecodeOverlap (gpu/overlap.py), which samples its early step, leaves
those steps alone. The forward pass needs no mask, only those tokens, which the runner holds
right after sampling under the masks. So after a masked step the runner queues the next
decode's forward at once (fed the host tokens, one position on) and keeps its logits on the
device; the actors plan and the grammar computes the next masks while the GPU runs it:

    finish(masks N):  sample N under masks | forward N+1 fed the samples on the device
                      (logits kept), then tolist
    actors:                                       | update, grammar masks, plan (GPU busy)
    launch(plan N+1): the kept step? yes: its logits wait for the masks; finish samples them
                                     no:  discard, run plan N+1's forward as before

When the grammar's masks for the kept step come before its plan (EngineConfig.
draw_masked_ahead), the runner draws the kept step under them at once and queues the forward
after it (`draw`); the plan then only confirms (`take_drawn`): its decodes are the
kept step's, or fewer (requests that ended), and the drawn tokens answer it. Any other plan
drops the draw and the forward after it, as a discard does, and runs as before.

A plan that is the kept step plus work it lacks (a prefill chunk, a request joining) takes the
kept logits for its decodes and runs a forward of the rest. Any other plan (a swap, a copy,
proposals, another order) discards it: the forward wrote KV only at each request's lookahead
slot, and the same argument as for a discarded DecodeOverlap step holds (gpu/overlap.py,
DecodeOverlap.take).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch
from troupe.gpu.device_inputs import host_to_device
from troupe.gpu.early_launch import fed_decode_inputs, launchable, matching_rows, split_rows
from troupe.gpu.request_states import RequestState, RequestStates
from troupe.gpu.sampler import WITHHELD, SamplingBatch
from troupe.gpu.step_inputs import StepInputs, build_step_inputs
from troupe.messages import StepPlan, TokenMasks

# the runner's forward; the tensor, when given, replaces inputs.input_ids (ids on the device)
Forward = Callable[[StepInputs, torch.Tensor | None], torch.Tensor]


@dataclasses.dataclass(frozen=True, slots=True)
class Launched:
    """A masked plan run up to its logits (ModelRunner.launch); finish samples it under the
    masks."""

    plan: StepPlan
    states: list[RequestState]
    inputs: StepInputs
    logits: torch.Tensor
    batch: SamplingBatch | None  # None: no row samples, or the step verifies proposals


@dataclasses.dataclass(kw_only=True, eq=False)
class KeptForward:
    """A decode forward launched before its plan; its logits are still on the device."""

    rows: dict[str, int]  # request id -> row
    positions: np.ndarray  # int64 per row: the position the step computes
    input_tokens: list[int]  # per row: the token fed
    inputs: StepInputs
    logits: torch.Tensor  # [rows, vocab], model.logits_dtype
    states: list[RequestState]  # per row


@dataclasses.dataclass(kw_only=True, eq=False)
class _Drawn:
    """A kept step drawn under masks that came before its plan (the forward after it, if
    queued, is the kept forward now)."""

    source: KeptForward
    masks: TokenMasks
    token_ids: list[int]  # per row of `source` (WITHHELD where the logits were not finite)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Drawn:
    """A masked plan's answer, drawn before the plan came: its decodes' ids and tokens."""

    request_ids: list[str]
    token_ids: list[int]  # WITHHELD where the logits were not finite
    masks: TokenMasks  # the masks they were drawn under


class ForwardAhead:
    """Owns the kept forward: launches it after a masked step, hands it to the next masked plan
    that is the same step (`take`), or drops it (`discard`)."""

    def __init__(
        self,
        states: RequestStates,
        forward: Forward,
        *,
        block_size: int,
        max_model_len: int,
    ) -> None:
        self._states = states
        self._forward = forward
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.num_launched = 0  # forwards launched ahead of their plan
        self.num_hits = 0  # ... whose plan was that step
        self.num_drawn = 0  # ... of those, drawn before their plan came (take_drawn)
        self._ahead: KeptForward | None = None
        self._drawn: _Drawn | None = None

    @property
    def pending(self) -> bool:
        return self._ahead is not None

    def discard(self) -> None:
        self._ahead = self._drawn = None

    def launch(
        self,
        states: list[RequestState],
        next_pos: np.ndarray,
        request_ids: list[str],
        token_ids: list[int] | torch.Tensor,
    ) -> bool:
        """Queue the forward of the just-sampled `token_ids` at `next_pos`, one per state;
        whether it was. Ids still on the device (queued before they are read back) only where
        no state keeps a penalty history; `fed` then gives their host copy."""
        self._ahead = None
        device_ids = token_ids if isinstance(token_ids, torch.Tensor) else None
        if device_ids is not None and any(s.tokens is not None for s in states):
            return False
        num_blocks = launchable(states, next_pos, self.block_size, self.max_model_len)
        if num_blocks is None:
            return False
        host_ids = None if isinstance(token_ids, torch.Tensor) else token_ids
        inputs = fed_decode_inputs(
            states, next_pos, num_blocks, host_ids, self._states, self.block_size
        )
        self.num_launched += 1
        self._ahead = KeptForward(
            rows={rid: i for i, rid in enumerate(request_ids)},
            positions=next_pos,
            input_tokens=list(host_ids or ()),
            inputs=inputs,
            logits=self._forward(inputs, device_ids),
            states=states,
        )
        return True

    def fed(self, token_ids: list[int]) -> None:
        """The host copy of the device ids the kept forward was fed: what the next plan must
        feed to be that step. A row withheld (non-finite logits) drops it: its request fails."""
        if self._ahead is not None:
            if WITHHELD in token_ids:
                self._ahead = None
            else:
                self._ahead.input_tokens = list(token_ids)

    def draw(self, masks: TokenMasks, sample: Callable[[KeptForward], list[int]]) -> None:
        """Draw the kept forward now if `masks` are for its rows: `sample` samples it under
        them and queues the forward after it (launch), which is then the kept one; the next
        plan confirms the draw (take_drawn). Nothing otherwise.

        The masks name the kept step's constrained rows in any order: a row they lack is
        unconstrained (all tokens allowed, as in the plan), and a row they name failed (its
        grammar ended at a stop token, or broke) draws a token no plan uses: an ended request
        is not in the next plan, a broken one fails in its result."""
        source = self._ahead
        if source is None or self._drawn is not None:
            return
        if not source.rows.keys() >= set(masks.request_ids):
            return
        try:
            token_ids = sample(source)
        except BaseException:
            self.discard()  # the plan runs as if nothing was drawn
            raise
        if self._ahead is source:  # nothing queued after the draw
            self._ahead = None
        self._drawn = _Drawn(source=source, masks=masks, token_ids=token_ids)

    def take_drawn(self, plan: StepPlan) -> Drawn | None:
        """The plan's drawn tokens if it is the drawn step (or that step less requests that
        ended) sampled under those masks alone; else None, and the draw and the forward after
        it are dropped (the plan runs as before). The next forward is queued now if the draw
        could not queue it (no lookahead block yet), as a masked step's finish does."""
        drawn, self._drawn = self._drawn, None
        if drawn is None:
            return None
        source = drawn.source
        rows = None
        if (
            not plan.awaits_masks
            and plan.ahead_masks_of == drawn.masks.step_id
            and not (plan.swap_out or plan.swap_in or plan.copy_blocks)
        ):
            rows = matching_rows(plan.seqs, source.rows, source.input_tokens, source.positions)
        if rows is None:
            self._ahead = None
            return None
        if plan.released:
            self._states.release(plan.released)
        states = self._states.apply(plan.seqs)  # lookahead blocks for the step after
        kept = self._ahead
        if kept is not None:  # apply set the plan's positions; the kept forward is one on
            for state, pos in zip(kept.states, kept.positions.tolist(), strict=True):
                state.num_tokens = pos + 1
        self.num_hits += 1
        self.num_drawn += 1
        request_ids = [w.request_id for w in plan.seqs]
        token_ids = [drawn.token_ids[r] for r in rows]
        if self._ahead is None and WITHHELD not in token_ids:
            next_pos = np.fromiter((s.num_tokens for s in states), np.int64, len(states))
            self.launch(states, next_pos, request_ids, token_ids)
        return Drawn(request_ids=request_ids, token_ids=token_ids, masks=drawn.masks)

    def take(self, plan: StepPlan) -> tuple[list[RequestState], StepInputs, torch.Tensor] | None:
        """The plan's states, inputs and logits if it is the kept step (or the kept step less
        requests that ended), or that step plus work it does not have (prefill chunks, new
        requests: their forward runs now, the kept logits answer the rest); else None, and the
        kept step is dropped."""
        ahead, self._ahead = self._ahead, None
        if ahead is None or plan.swap_out or plan.swap_in or plan.copy_blocks or not plan.seqs:
            return None
        rows = split_rows(plan.seqs, ahead.rows, ahead.input_tokens, ahead.positions)
        if rows is None:
            return None
        extras = plan.seqs[len(rows) :]
        if plan.released:
            self._states.release(plan.released)
        states = self._states.apply(plan.seqs)  # lookahead blocks for the step after
        self.num_hits += 1
        logits, inputs = ahead.logits, ahead.inputs
        if len(rows) != len(ahead.rows):
            picked = np.asarray(rows, dtype=np.int64)
            logits = logits[host_to_device(picked, logits.device)]  # no wait for the stream
            # only what the runner reads after a forward: which rows sample, their lengths
            inputs = dataclasses.replace(
                inputs, sampled_rows=np.arange(len(rows)), seq_lens=inputs.seq_lens[picked]
            )
        if extras:
            more = build_step_inputs(
                extras,
                states[len(rows) :],
                self._states.tables,
                self.block_size,
                adapters=self._states.has_adapters,
            )
            if logits is ahead.logits:  # a view of a graph's output: the next forward reuses it
                logits = logits.clone()
            logits = torch.cat([logits, self._forward(more, None)])
            inputs = dataclasses.replace(
                inputs,
                sampled_rows=np.concatenate([np.arange(len(rows)), more.sampled_rows + len(rows)]),
                seq_lens=np.concatenate([inputs.seq_lens[: len(rows)], more.seq_lens]),
            )
        return states, inputs, logits
