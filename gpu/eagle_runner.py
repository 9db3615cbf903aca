"""The EAGLE head's side of speculative decoding (speculative_method "eagle", "eagle3", and
"mtp": DeepSeek's multi-token-prediction layer is driven the same way, gpu/mtp_model.py).

As the draft model's round (gpu/draft_runner.py) in all it shares with it: the head's own
paged KV indexed by the target's block tables (a swap moves its blocks too), k proposals per
sampled sequence on its SampledToken, draws with the request's settings and the target's
counter-based noise at the same position (so outputs never depend on the head: the target
accepts a proposal only when it equals its own draw), the per-request backoff when the
scheduler declines offers (draft_state.Offers), no draws in a step sampling
`disable_batch_size` sequences or more. What differs is the input: the head reads the
target's hidden states (gpu/target_hidden.py) of the step just run, so it is fed every
step, whoever proposes (those states exist only now: gpu/eagle_state.py):

    step N (target)  computes rows up to position L-1, samples t = x(L)
    head round       rows p .. L-1 (one forward): fc(cat(embed(x(p+1)), h(p))), h: target's
                     e1 = draw(row L-1)      the token at L+1
                     e2 = draw(row L: fc(cat(embed(e1), out(L-1))))   out: the head's own
    step N+1         t e1 .. ek verified; the head reads the rows of t and the accepted ones
                     with the target's hidden states of that step

The head runs eagerly (one layer: its launches are few beside the target's graphs).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from troupe.gpu.device_inputs import device_metadata, host_to_device
from troupe.gpu.eagle_load import EagleModel
from troupe.gpu.eagle_state import EagleSeqs, HeadFeed
from troupe.gpu.kv_cache import KVCache, kv_dtype
from troupe.gpu.proposal_draws import draw_rounds, record_sampled, with_proposals
from troupe.gpu.request_states import RequestState
from troupe.gpu.runner_setup import RunnerOptions
from troupe.gpu.step_inputs import StepInputs, build_step_inputs
from troupe.messages import SampledToken, SeqWork, StepPlan


class EagleRunner:
    """The head, its KV pool and what it has read of each request."""

    @classmethod
    def for_options(cls, eagle: EagleModel, options: RunnerOptions) -> EagleRunner:
        """The EAGLE runner of a ModelRunner built with `options`."""
        return cls(
            eagle,
            num_tokens=options.num_speculative_tokens,
            num_gpu_blocks=options.num_gpu_blocks,
            num_cpu_blocks=options.num_cpu_blocks,
            block_size=options.block_size,
            max_model_len=options.max_model_len,
            kv_dtype=kv_dtype(options.kv_cache_dtype, eagle.head.dtype),
            disable_batch_size=options.spec_disable_batch_size,
            backoff_steps=options.spec_backoff_steps,
        )

    def __init__(
        self,
        eagle: EagleModel,
        *,
        num_tokens: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        block_size: int,
        max_model_len: int,
        kv_dtype: torch.dtype,
        disable_batch_size: int | None = None,
        backoff_steps: int = 16,
    ) -> None:
        self.head = eagle.head
        self.target_hidden = eagle.target_hidden
        self.num_tokens = num_tokens  # k: proposals per sequence per round
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.vocab_size = eagle.config.vocab_size
        self.disable_batch_size = disable_batch_size
        self.device = self.head.device
        self.kv = KVCache(
            eagle.config,
            num_gpu_blocks=num_gpu_blocks,
            num_cpu_blocks=num_cpu_blocks,
            block_size=block_size,
            dtype=kv_dtype,
            device=self.device,
        )
        if self.device.type == "cpu":
            self.kv.gpu.zero_()  # a slot it never wrote may be read (eagle_state.py): no NaN
        self.head.set_kv_scales(self.kv.scales)
        self.seqs = EagleSeqs(backoff_steps)
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
        """`sampled` (the step's tokens, plan order) with the head's proposals attached."""
        by_id = {t.request_id: t for t in sampled}
        limit = self.disable_batch_size
        may_draw = limit is None or len(sampled) < limit  # else the scheduler proposes nothing
        num_rows = sum(len(w.token_ids) + len(w.draft_token_ids) for w in seqs)
        hidden = self.target_hidden.rows(num_rows)
        feeds: list[HeadFeed] = []
        feed_states: list[RequestState] = []
        draws: list[int] = []  # per feed: proposals to draw after it (0: none)
        row = 0
        for work, state in zip(seqs, states, strict=True):
            token = by_id.get(work.request_id) if work.sample else None
            if token is not None:
                record_sampled(work, state, token)
            feed = self.seqs.feed(work, token, row, hidden)
            row += len(work.token_ids) + len(work.draft_token_ids)
            if not feed.token_ids:
                continue
            k = 0
            if may_draw and token is not None and state.params.structured_outputs is None:
                if feed.seq.skip == 0:
                    k = self._room(state, feed.num_committed)
            feeds.append(feed)
            feed_states.append(state)
            draws.append(k)
        if not feeds:
            return sampled
        return with_proposals(sampled, self._round(feeds, feed_states, draws, hidden, tables))

    def _room(self, state: RequestState, num_committed: int) -> int:
        """Proposals that fit: their rows' KV inside the table, the last one's position
        inside max_model_len."""
        cap = min(state.num_blocks * self.block_size, self.max_model_len)
        room = min(cap - num_committed + 1, self.max_model_len - num_committed)
        return max(0, min(self.num_tokens, room))

    def _round(
        self,
        feeds: list[HeadFeed],
        states: list[RequestState],
        draws: list[int],
        hidden: torch.Tensor,
        tables: np.ndarray,
    ) -> dict[str, tuple[int, ...]]:
        """One forward over every fed row, then k draws after each sequence that draws."""
        self.num_rounds += 1
        works = tuple(
            SeqWork(request_id=f.request_id, token_ids=f.token_ids, start_pos=f.start, sample=k > 0)
            for f, k in zip(feeds, draws, strict=True)
        )
        inputs = build_step_inputs(works, states, tables, self.block_size)
        out, fed = self._forward(inputs, self._head_input(feeds, hidden))
        if not any(draws):
            return {}
        index = host_to_device(inputs.logits_indices, self.device)
        picked = [i for i, k in enumerate(draws) if k > 0]
        ks = np.array([draws[i] for i in picked], np.int64)
        drawn = self._draw_all(
            [feeds[i] for i in picked],
            [states[i] for i in picked],
            ks,
            (out[index], fed[index]),
            tables,
        )
        proposals: dict[str, tuple[int, ...]] = {}
        for i, tokens in zip(picked, drawn, strict=True):
            feeds[i].seq.offered = True
            proposals[feeds[i].request_id] = tuple(tokens)
            self.num_proposed += len(tokens)
        return proposals

    def _head_input(self, feeds: list[HeadFeed], hidden: torch.Tensor) -> torch.Tensor:
        """Each fed row's hidden state: the step's rows, a waiting row's kept one first."""
        index: list[np.ndarray] = []
        kept: list[torch.Tensor] = []
        for f in feeds:
            num_step_rows = len(f.token_ids)
            if f.pending is not None:
                index.append(np.array([len(hidden) + len(kept)]))
                kept.append(f.pending)
                num_step_rows -= 1
            index.append(np.arange(f.first_row, f.first_row + num_step_rows))
        source = torch.cat([hidden, torch.stack(kept)]) if kept else hidden
        return source[host_to_device(np.concatenate(index), self.device)]

    def _forward(self, inputs: StepInputs, taps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over the rows fed the target's tapped states `taps`: (the rows' states
        for the logits, what a draft step after each row is fed)."""
        meta = device_metadata(inputs, self.device)
        ids = host_to_device(inputs.input_ids, self.device)
        positions = host_to_device(inputs.positions, self.device)
        return self.head.run(ids, positions, self.head.combine(taps), meta, self.kv.layers)

    def _draw_all(
        self,
        feeds: list[HeadFeed],
        states: list[RequestState],
        ks: np.ndarray,
        last: tuple[torch.Tensor, torch.Tensor],
        tables: np.ndarray,
    ) -> list[list[int]]:
        """Each sequence's k draws: e1 from its last fed row (`last`: its states for the
        logits, and what the next step is fed), then e(j+1) from a decode step of the head
        fed e_j and its own output at the row before; one read-back."""
        states_out, out = last

        def step(
            inputs: StepInputs, positions: np.ndarray, ids: torch.Tensor, kept: torch.Tensor | None
        ) -> torch.Tensor:
            nonlocal out
            if kept is not None:
                out = out[kept]
            meta = device_metadata(inputs, self.device)
            states_out, out = self.head.run(
                ids, host_to_device(positions, self.device), out, meta, self.kv.layers
            )
            return self.head.compute_logits(states_out)

        return draw_rounds(
            self.head.compute_logits(states_out),
            states,
            ks,
            np.fromiter((f.num_committed for f in feeds), np.int64, len(feeds)),
            step,
            lag=2,  # e_j's row sits at position committed + j - 2, draws e_(j+1) at committed + j
            vocab_size=self.vocab_size,
            tables=tables,
            block_size=self.block_size,
        )

    def sleep_modules(self) -> tuple[nn.Module, ...]:
        """The head (sleep mode: gpu/sleep_parts.Companion)."""
        assert isinstance(self.head, nn.Module), "every head is a module (eagle_load.DraftHead)"
        return (self.head,)

    def drop_graphs(self) -> None:
        """Nothing: the head runs eagerly."""

    def capture_graphs(self) -> None:
        """Once awake: the pool as at start."""
        if self.device.type == "cpu":
            self.kv.gpu.zero_()
        self.kv.reset_scales()

    def close(self) -> None:
        self.seqs.clear()
