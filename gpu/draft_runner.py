"""The draft model's side of speculative decoding (speculative_method="draft_model").

After each step the runner hands the draft the step's plan and sampled tokens; the draft
reads what it has not seen (the step's prefill chunks, the target's token, accepted
proposals whose KV it lacks), then proposes k tokens after each sampled sequence. They travel
back on that sequence's SampledToken (`proposals`); the scheduler puts them in the next plan
as SeqWork.draft_token_ids, exactly as n-gram proposals, and the target verifies them.

    step N (target)  ...  t                       sampled t at position L-1
    draft round           catch-up: known .. t    one forward over every sequence's unseen
                                                  tokens (a decode graph when each has one)
                          e1 = draw(L)            then k-1 decode steps (decode graphs), fed
                          e2 = draw(L+1) ...      the draws on the device, one read-back
    step N+1 (target)     t  e1 .. ek  verified   SeqWork(token_ids=(t,), draft_token_ids=e)

The draft's KV lives in its own pool, indexed by the target's block tables: the same block
ids, a pool as many blocks long but smaller per block. So the allocator owns every block id
as before and a swap moves the draft's blocks with the target's. The scheduler keeps k
positions past each decode in the table (num_lookahead_tokens = k): the draft writes KV for
e1..e(k-1) there, at positions the target writes at the next step only in its own pool.

Draws use the request's sampling settings and the same counter-based noise as the target's
draw at that position (gpu/sampler.py), so a draft close to the target proposes what the
target will draw, sampled or greedy; the target accepts each proposal only if it equals its
own draw (gpu/spec_verify.py), so outputs do not depend on the draft at all.

Backoff: no round in a step that samples `disable_batch_size` sequences or more (the
scheduler's limit: speculative_disable_by_batch_size, or where the cost model says proposals
cannot pay, spec_cost.batch_limit; the scheduler plans no proposals then either), nor in a
step where no sequence wants proposals; sequences catch up at their next round, at most
max_num_batched_tokens tokens per round. The executor is not told of the scheduler's per-request
pause or its measured per-step backoff, but it sees their effect: a plan that carries a decode
without the proposals the draft offered for it. The draft then skips that request's next
`backoff_steps` rounds (gpu/draft_state.py, Offers.follow), so a paused request costs one
wasted round per pause, not one per step.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn
from troupe.gpu.draft_model import DraftModel
from troupe.gpu.draft_state import DraftSeq, DraftSeqs
from troupe.gpu.forward_pass import ForwardPass
from troupe.gpu.kv_cache import KVCache, kv_dtype
from troupe.gpu.proposal_draws import draw_rounds, record_sampled, with_proposals
from troupe.gpu.request_states import RequestState
from troupe.gpu.runner_setup import RunnerOptions
from troupe.gpu.step_inputs import StepInputs, build_step_inputs
from troupe.messages import SampledToken, SeqWork, StepPlan

# a proposing row of a round: (request id, its state, its token count L, proposals k)
_Row = tuple[str, RequestState, int, int]


class DraftRunner:
    """The draft model, its KV pool, its graphs and what it has seen of each request."""

    @classmethod
    def for_options(cls, draft: DraftModel, options: RunnerOptions) -> DraftRunner:
        """The draft runner of a ModelRunner built with `options`."""
        return cls(
            draft,
            num_tokens=options.num_speculative_tokens,
            num_gpu_blocks=options.num_gpu_blocks,
            num_cpu_blocks=options.num_cpu_blocks,
            block_size=options.block_size,
            max_num_seqs=options.max_num_seqs,
            max_model_len=options.max_model_len,
            kv_dtype=kv_dtype(options.kv_cache_dtype, draft.model.dtype),
            use_graphs=not options.enforce_eager,
            mixed_graph_tokens=options.mixed_graph_tokens,
            max_round_tokens=options.max_num_batched_tokens,
            disable_batch_size=options.spec_disable_batch_size,
            backoff_steps=options.spec_backoff_steps,
        )

    def __init__(
        self,
        draft: DraftModel,
        *,
        num_tokens: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_model_len: int,
        kv_dtype: torch.dtype,
        use_graphs: bool,
        mixed_graph_tokens: int = 0,
        max_round_tokens: int = 4096,
        disable_batch_size: int | None = None,
        backoff_steps: int = 16,
    ) -> None:
        model = draft.model
        self.num_tokens = num_tokens  # k: proposals per sequence per round
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.vocab_size = draft.config.vocab_size
        self.max_round_tokens = max_round_tokens
        self.disable_batch_size = disable_batch_size
        self.kv = KVCache(
            draft.config,
            num_gpu_blocks=num_gpu_blocks,
            num_cpu_blocks=num_cpu_blocks,
            block_size=block_size,
            dtype=kv_dtype,
            device=model.device,
        )
        if model.device.type == "cpu":
            self.kv.gpu.zero_()  # a slot it never wrote may be read (draft_state.py): no NaN
        model.set_kv_scales(self.kv.scales)
        self.model = model
        self._new_pass = functools.partial(
            ForwardPass,
            model,
            self.kv,
            max_num_seqs=max_num_seqs,
            max_blocks_per_seq=-(-max_model_len // block_size),
            max_model_len=max_model_len,
            use_graphs=use_graphs,
            mixed_graph_tokens=mixed_graph_tokens,
        )
        self._pass = self._new_pass()
        self.kv.reset_scales()  # graph captures wrote made-up KV
        self.seqs = DraftSeqs(block_size, backoff_steps)
        self.num_rounds = 0
        self.num_proposed = 0

    def prepare(self, plan: StepPlan) -> None:
        """The plan's releases and swaps, as the target's pool gets them."""
        self.seqs.release(plan.released)
        self.kv.swap_out(plan.swap_out)
        self.kv.swap_in(plan.swap_in)

    def propose(
        self,
        seqs: tuple[SeqWork, ...],
        states: list[RequestState],
        tables: np.ndarray,
        sampled: tuple[SampledToken, ...],
    ) -> tuple[SampledToken, ...]:
        """`sampled` (the step's tokens, plan order) with the draft's proposals attached."""
        by_id = {t.request_id: t for t in sampled}
        entries: list[tuple[SeqWork, DraftSeq, RequestState, bool]] = []
        for work, state in zip(seqs, states, strict=True):
            seq = self.seqs.apply(work, state.num_blocks)
            token = by_id.get(work.request_id) if work.sample else None
            if token is not None:
                self.seqs.commit(seq, work, token)
                record_sampled(work, state, token)
            wants = (
                token is not None
                and state.params.structured_outputs is None
                and self.seqs.wants(seq)
            )
            entries.append((work, seq, state, wants))
        limit = self.disable_batch_size
        if limit is not None and len(sampled) >= limit:
            return sampled  # per-step backoff: the scheduler proposes nothing this step
        if not any(wants for _, _, _, wants in entries):
            return sampled  # nobody to propose for: the catch-up waits for the next round
        return with_proposals(sampled, self._round(entries, tables))

    def _round(
        self, entries: list[tuple[SeqWork, DraftSeq, RequestState, bool]], tables: np.ndarray
    ) -> dict[str, tuple[int, ...]]:
        """Catch every sequence up (within the round's budget; not those skipping rounds),
        then draw k tokens after each one that wants proposals and has room for them."""
        budget = self.max_round_tokens
        feeds: list[SeqWork] = []
        feed_states: list[RequestState] = []
        rows: list[_Row] = []
        row_seqs: list[DraftSeq] = []
        for work, seq, state, wants in entries:
            if seq.skip > 0:
                continue  # its offers go unused: it catches up when it proposes again
            cap = min(state.num_blocks * self.block_size, self.max_model_len)
            n = min(len(seq.known), max(cap - seq.computed, 0), budget)
            if n == 0:
                continue
            end = seq.computed + n  # L: the last fed token's logits draw position L
            k = 0
            if wants and n == len(seq.known):
                # KV of e1..e(k-1) at L..L+k-2 inside the table; ek at most at max_model_len-1
                k = min(self.num_tokens, cap - end + 1, self.max_model_len - end)
            feeds.append(
                SeqWork(
                    request_id=work.request_id,
                    token_ids=tuple(seq.known[:n]),
                    start_pos=seq.computed,
                    sample=k > 0,
                )
            )
            feed_states.append(state)
            seq.fed(n)
            if k > 0:
                rows.append((work.request_id, state, end, k))
                row_seqs.append(seq)
            budget -= n
            if budget == 0:
                break
        if not feeds:
            return {}
        self.num_rounds += 1
        inputs = build_step_inputs(tuple(feeds), feed_states, tables, self.block_size)
        logits = self._pass(inputs)
        if not rows:
            return {}
        drawn = self._draw_all(rows, logits, tables)
        out: dict[str, tuple[int, ...]] = {}
        for (rid, _, _, _), seq, tokens in zip(rows, row_seqs, drawn, strict=True):
            seq.spec = tuple(tokens[:-1])  # their KV is in the pool, after the last fed token
            seq.offered = True
            out[rid] = tuple(tokens)
            self.num_proposed += len(tokens)
        return out

    def _draw_all(
        self, rows: list[_Row], logits: torch.Tensor, tables: np.ndarray
    ) -> list[list[int]]:
        """Each row's k draws: the first from the catch-up's logits, each next one from a
        decode step fed the previous draw on the device; one read-back at the end."""

        def step(
            inputs: StepInputs, _: np.ndarray, ids: torch.Tensor, kept: torch.Tensor | None
        ) -> torch.Tensor:
            return self._pass(inputs, input_ids=ids)

        return draw_rounds(
            logits,
            [r[1] for r in rows],
            np.fromiter((r[3] for r in rows), np.int64, len(rows)),
            np.fromiter((r[2] for r in rows), np.int64, len(rows)),
            step,
            lag=1,  # e_j's KV at its own position, then e_(j+1)'s logits
            vocab_size=self.vocab_size,
            tables=tables,
            block_size=self.block_size,
        )

    def sleep_modules(self) -> tuple[nn.Module, ...]:
        """The draft model (sleep mode: gpu/sleep_parts.Companion)."""
        return (self.model,)

    def drop_graphs(self) -> None:
        """Its graphs and CPU bindings read the addresses that sleep frees."""
        self._pass.close()
        self._pass.cpu_decode = None

    def capture_graphs(self) -> None:
        """Once awake: the pool as at start, the graphs captured over the new addresses."""
        if self.model.device.type == "cpu":
            self.kv.gpu.zero_()
        self._pass = self._new_pass()
        self.kv.reset_scales()

    def close(self) -> None:
        self._pass.close()
        self.seqs.clear()
