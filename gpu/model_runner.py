"""ModelRunner: the real Runner. Owns the model, the KV pools and per-request state.

It runs each StepPlan: prepare the state, forward, sample (and, with a draft model, let it
propose after the step: gpu/draft_runner.py). Before that it asks its
DecodeOverlap (gpu/overlap.py) whether a decode step launched early already answers the plan,
and after a step that sampled every sequence it lets the DecodeOverlap launch the next one.
From an EngineConfig: gpu/runner_setup.py (RunnerOptions, loading, pool sizing).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch
from troupe.config import EngineConfig
from troupe.gpu.forward_ahead import Drawn, ForwardAhead, KeptForward, Launched
from troupe.gpu.forward_pass import ForwardPass
from troupe.gpu.kv_cache import KVCache, kv_dtype
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderModel
from troupe.gpu.overlap import DecodeOverlap, LogitsHook, Split
from troupe.gpu.proposer import Drafter, build_proposer
from troupe.gpu.readback import Readback
from troupe.gpu.request_states import RequestState, RequestStates
from troupe.gpu.runner import HiddenOutputs, RunnerStats, SequencesFailed
from troupe.gpu.runner_setup import RunnerOptions, load_for_config
from troupe.gpu.sampler import (
    WITHHELD,
    SamplingBatch,
    sample,
    sampled_tokens,
    warm_up_draw,
    withhold_non_finite,
)
from troupe.gpu.sampling_batch import SamplingBatches
from troupe.gpu.scored_forward import Classifier, ScoredForward
from troupe.gpu.sleep_mode import ModelSleeper
from troupe.gpu.spec_verify import verify_proposals
from troupe.gpu.step_inputs import StepInputs, build_step_inputs, streaming_inputs
from troupe.gpu.token_bitmask import BitmaskUpload
from troupe.gpu.weight_update import WeightReload
from troupe.messages import SampledToken, SeqWork, StepPlan, TokenLogprob, TokenMasks
from troupe.request_seeds import SeedSource

__all__ = ["ModelRunner", "RunnerOptions", "kv_dtype"]  # the options live in runner_setup.py


class ModelRunner:
    """Executes StepPlans on a DecoderModel over the paged KV cache; see gpu/runner.py."""

    def __init__(
        self,
        config: ModelConfig,
        model: DecoderModel,
        options: RunnerOptions,
        *,
        logits_hook: LogitsHook | None = None,
        draft: Drafter | None = None,
        owns_model: bool = False,
    ) -> None:
        """`logits_hook`: a test seam that may change each step's logits before sampling (fault
        injection: a NaN row must fail its request only); the engine never sets it. `draft`: a
        draft model or EAGLE head proposing options.num_speculative_tokens after each step.
        `owns_model`: the runner loaded `model` (from_config, the parallel workers), so close()
        frees its weights too; a model the caller built stays usable after close()."""
        self._owns_model = owns_model
        self.model_config = config
        self.model = model
        self.device = model.device
        self.block_size = options.block_size
        self.num_gpu_blocks = options.num_gpu_blocks
        self.num_cpu_blocks = options.num_cpu_blocks
        self.vocab_size = config.vocab_size
        self._batches = SamplingBatches(config.vocab_size, self.device, options.logprobs_mode)
        self.max_model_len = options.max_model_len
        self.eos_token_ids = config.eos_token_ids
        self.max_blocks_per_seq = -(-options.max_model_len // options.block_size)
        # StreamingLLM requests run up to max_stream_len positions: tables and histories span
        # them (the rotary table too: runner_setup.max_positions)
        self.max_stream_len = options.max_stream_len
        max_positions = max(options.max_model_len, options.max_stream_len)
        self.kv = KVCache.for_options(config, options, model.dtype, self.device)
        model.set_kv_scales(self.kv.scales)
        self._seeds = SeedSource(options.seed)
        self._states = RequestStates(
            max_model_len=max_positions,
            max_blocks_per_seq=-(-max_positions // options.block_size),
            block_size=options.block_size,
            new_seed=self._seeds.draw,
            capacity=options.max_num_seqs,
            eos_token_ids=tuple(config.eos_token_ids),
            adapter_ids=None if model.lora is None else model.lora.ids,
        )
        self._pass = ForwardPass.for_options(model, self.kv, options)
        self._forward = self._pass
        # plans' forwards, with a classification model's score head (None: not one)
        self._step_forward = ScoredForward(self._pass, model.compute_logits, Classifier.of(model))
        self._draft = None if draft is None else build_proposer(draft, options)
        # every plan carries proposals with a draft: an overlapped plain decode would never hit
        self.overlap_schedule = options.overlap_schedule and draft is None
        # the scheduler keeps one position past each decode in its table: the overlapped slot;
        # with a draft, k: the draft writes its proposals' KV there (gpu/draft_runner.py)
        self.num_lookahead_tokens = 1 if self.overlap_schedule else 0
        if draft is not None:
            self.num_lookahead_tokens = options.num_speculative_tokens
        self.kv_window = config.kv_window
        self.lora = model.lora
        self.weights = WeightReload(model, config)  # in place: gpu/runner.ReloadsWeights
        self.kv_pages_on_write = self.device.type == "cpu"  # kv_cache.KVCache: no zero-fill
        self._num_steps = 0
        self._overlap = DecodeOverlap(
            self._states,
            self._forward,
            block_size=options.block_size,
            max_model_len=options.max_model_len,
            batches=self._batches,
            logits_hook=logits_hook,
        )
        self._ahead = ForwardAhead(
            self._states,
            self._forward,
            block_size=options.block_size,
            max_model_len=options.max_model_len,
        )
        self._logits_hook = logits_hook
        quiesce = (self._overlap.discard, self._ahead.discard)  # steps launched ahead
        self.sleeper = ModelSleeper(
            model, self.kv, options, self._pass, self.weights, quiesce, self._draft
        )
        self.kv.reset_scales()  # graph captures wrote made-up KV: the first real write sets them
        max_rows = options.max_num_seqs * (1 + options.num_speculative_tokens)  # verifications
        warm_up_draw(config.vocab_size, self.device, model.logits_dtype, max_rows)  # not mid-step
        # a plan launched by launch(), awaiting its grammar masks: (plan, states, inputs, logits)
        self._launched: Launched | None = None
        self._drawn: Drawn | None = None  # a masked plan drawn before it came (draw_ahead)
        self._upload_bitmask = BitmaskUpload(self.device)

    def statistics(self) -> RunnerStats:
        """Steps run and overlapped steps launched and used, so far."""
        return RunnerStats(
            num_steps=self._num_steps,
            num_overlapped=self._overlap.num_overlapped + self._ahead.num_launched,
            num_overlap_hits=self._overlap.num_overlap_hits + self._ahead.num_hits,
            num_overlap_splits=self._overlap.num_overlap_splits,
            num_overlap_merges=self._overlap.num_overlap_merges,
            num_draft_rounds=self._draft.num_rounds if self._draft else 0,
            num_draft_tokens=self._draft.num_proposed if self._draft else 0,
        )

    @classmethod
    def from_config(cls, config: EngineConfig) -> ModelRunner:
        """Load config.model (default GGUF when None) and size the pools from the config."""
        loaded = load_for_config(config)
        return cls(loaded.config, loaded.model, loaded.options, draft=loaded.draft, owns_model=True)

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        """Apply released, swap_out, swap_in, then run plan.seqs; one token per sampled seq."""
        self._num_steps += 1
        self._step_forward.forget(plan.released)
        if plan.seqs or plan.swap_out or plan.swap_in:
            self._ahead.discard()  # a masked step's kept forward: this plan is not it
        taken = self._overlap.take(plan)
        if isinstance(taken, Split):
            return self._run_split(taken)
        if taken is not None:
            return taken  # the pending overlapped step answered it (or only releases)
        prepared = self._prepare(plan)
        if prepared is None:
            return ()
        states, inputs = prepared
        return self._run_and_draft(plan.seqs, states, inputs, self._step_forward(inputs))

    def launch(self, plan: StepPlan) -> None:
        """Run a plan that awaits grammar masks up to its logits; finish() samples it."""
        self._num_steps += 1
        self._step_forward.forget(plan.released)
        self._overlap.discard()  # its samples were drawn without masks
        self._launched = None
        if plan.reads_hidden:  # nothing ahead read its hidden rows
            self._ahead.discard()
        self._drawn = self._ahead.take_drawn(plan)  # drawn before the plan came (draw_ahead)?
        if self._drawn is not None:
            return
        ahead = self._ahead.take(plan)  # the forward queued after the last masked step?
        if ahead is None:
            prepared = self._prepare(plan)
            if prepared is None:
                return
            ahead = (*prepared, self._step_forward(prepared[1]))
        states, inputs, logits = ahead
        batch = None  # built now, while the grammar computes the masks; not for verification
        if inputs.num_logits is None and len(inputs.sampled_rows):
            rows = inputs.sampled_rows.tolist()
            batch = self._batches.build([states[r] for r in rows])
        self._launched = Launched(plan, states, inputs, logits, batch)

    def finish(self, masks: TokenMasks) -> tuple[SampledToken, ...]:
        """Sample the launched plan under `masks` (no overlapped launch after it)."""
        drawn, self._drawn = self._drawn, None
        if drawn is not None:  # drawn before its plan came, under these masks (draw_ahead)
            assert masks.step_id == drawn.masks.step_id, "the drawn step's own masks"
            return sampled_tokens(
                drawn.request_ids, drawn.token_ids, (None,) * len(drawn.token_ids)
            )
        done, self._launched = self._launched, None
        if done is None:
            return ()
        return self._run_and_draft(
            done.plan.seqs, done.states, done.inputs, done.logits, masks, done.batch
        )

    def _run_and_draft(
        self,
        seqs: tuple[SeqWork, ...],
        states: list[RequestState],
        inputs: StepInputs,
        logits: torch.Tensor,
        masks: TokenMasks | None = None,
        batch: SamplingBatch | None = None,
    ) -> tuple[SampledToken, ...]:
        """_run, then the draft's proposals after the tokens (the failed sequences' too)."""
        draft = self._draft
        if draft is None:
            return self._run(seqs, states, inputs, logits, masks=masks, batch=batch)
        try:
            sampled = self._run(seqs, states, inputs, logits, masks=masks, batch=batch)
        except SequencesFailed as exc:
            sampled = draft.propose(seqs, states, self._states.tables, exc.sampled)
            raise SequencesFailed(sampled, exc.failed) from None
        return draft.propose(seqs, states, self._states.tables, sampled)

    def _run(
        self,
        seqs: tuple[SeqWork, ...],
        states: list[RequestState],
        inputs: StepInputs,
        logits: torch.Tensor,
        *,
        split: Split | None = None,
        masks: TokenMasks | None = None,
        batch: SamplingBatch | None = None,
    ) -> tuple[SampledToken, ...]:
        """Sample `seqs` from their `logits` (under grammar `masks` if given; `batch`: their
        sampling batch, built at launch); with a split, its
        decodes' tokens go first. Then, without masks, launch the next decode of every row
        that sampled (a chunk that did not joins later)."""
        rows = inputs.sampled_rows.tolist()
        if inputs.num_logits is not None:  # proposals to verify: no overlap after this step
            assert split is None, "a split never carries proposals (early_launch.split_rows)"
            hook, batches = self._logits_hook, self._batches
            return verify_proposals(
                seqs, states, rows, inputs.num_logits, logits, batches=batches, logits_hook=hook
            )
        request_ids = [seqs[r].request_id for r in rows]
        token_ids: list[int] = []
        logprobs: tuple[TokenLogprob | None, ...] = ()
        next_pos = inputs.seq_lens[rows].astype(np.int64)
        sampled = [states[r] for r in rows]
        if masks is not None:
            if rows:
                token_ids, logprobs = self._draw_masked(
                    sampled, request_ids, logits, masks, next_pos, batch
                )
            return sampled_tokens(request_ids, token_ids, logprobs)
        if rows:
            token_ids, logprobs, _ = self._sample(logits, sampled, request_ids, None, batch)
        if split is not None:
            request_ids = split.request_ids + request_ids
            token_ids = split.token_ids + token_ids
            logprobs = (None,) * len(split.token_ids) + logprobs
            if not split.launched:
                sampled = split.states + sampled
                next_pos = np.concatenate([split.next_pos, next_pos])
            else:
                sampled = []  # the decodes' next step is queued; the extras fill the cache
        if self.overlap_schedule and sampled and WITHHELD not in token_ids:
            # each row that sampled: its next step is a decode of the token just sampled
            tail = len(request_ids) - len(sampled)
            self._overlap.launch(sampled, next_pos, request_ids[tail:], token_ids[tail:])
        return sampled_tokens(request_ids, token_ids, logprobs)

    def _run_split(self, split: Split) -> tuple[SampledToken, ...]:
        """The pending step answered the plan's decodes; run the extras (prefill chunks, new
        requests: no swaps) on their own."""
        states = self._states.apply(split.extras)
        hidden = any(w.num_scored or w.pools for w in split.extras)
        inputs = self._inputs(split.extras, states, hidden)
        return self._run(split.extras, states, inputs, self._step_forward(inputs), split=split)

    def take_hidden_outputs(self) -> HiddenOutputs:
        """What the steps since the last call read from hidden states (gpu/runner.py)."""
        return self._step_forward.take()

    def draw_ahead(self, masks: TokenMasks) -> None:
        """Masks filled ahead that came before their plan: when they are the kept forward's
        rows, draw it under them now and queue the forward after it; the plan then only
        confirms (gpu/forward_ahead.py). Nothing otherwise."""

        def sample(kept: KeptForward) -> list[int]:
            rows, next_pos = list(kept.rows), kept.positions + 1
            return self._draw_masked(kept.states, rows, kept.logits, masks, next_pos, None)[0]

        self._ahead.draw(masks, sample)

    def _draw_masked(
        self,
        states: list[RequestState],
        request_ids: list[str],
        logits: torch.Tensor,
        masks: TokenMasks,
        next_pos: np.ndarray,
        batch: SamplingBatch | None,
    ) -> tuple[list[int], tuple[TokenLogprob | None, ...]]:
        """Sample rows under grammar masks; the next step needs the next masks, so its forward
        is queued as soon as the samples are (on the device), before they are read back."""
        early = None
        if self.overlap_schedule:
            early = functools.partial(self._ahead.launch, states, next_pos, request_ids)
        bitmask = self._upload_bitmask.for_rows(masks, request_ids)
        token_ids, logprobs, launched = self._sample(
            logits, states, request_ids, bitmask, batch, early
        )
        if launched:
            self._ahead.fed(token_ids)
        elif early is not None and WITHHELD not in token_ids:  # penalties: host tokens
            early(token_ids)
        return token_ids, logprobs

    def _sample(
        self,
        logits: torch.Tensor,
        states: list[RequestState],
        request_ids: list[str],
        bitmask: torch.Tensor | None = None,
        batch: SamplingBatch | None = None,
        early: Callable[[torch.Tensor], bool] | None = None,
    ) -> tuple[list[int], tuple[TokenLogprob | None, ...], bool]:
        """Token ids (one device->host copy: waits for the step's draw; WITHHELD for a row whose
        logits are not finite) and logprobs of the rows (`batch`: theirs, if built already);
        `early` is given the ids on the device after that copy is queued and may queue work
        behind it, which the read-back does not wait for: whether it launched work."""
        if self._logits_hook is not None:
            with torch.inference_mode():  # the logits are inference tensors: edits need it
                self._logits_hook(request_ids, logits)
        if batch is None:
            batch = self._batches.build(states)
        if bitmask is not None:  # grammar masks, on the device
            batch.token_bitmask = bitmask
        token_ids, logprobs = sample(logits, batch)
        checked = withhold_non_finite(token_ids, logits)
        if early is None:
            return checked.tolist(), logprobs, False
        # copied out before `early` queues the next forward, which may write its logits over
        # these (a graph's buffer): the read-back waits for this draw only (gpu/readback.py)
        readback = Readback(checked)
        launched = early(token_ids)
        return readback.read(), logprobs, launched

    def logits(self, plan: StepPlan) -> torch.Tensor:
        """Like execute, but return the fp32 logits [sampled seqs, vocab] instead of sampling."""
        self._overlap.discard()  # stream order keeps its KV writes before this plan's
        self._ahead.discard()
        prepared = self._prepare(plan)
        if prepared is None:
            return torch.empty(0, self.vocab_size, device=self.device)
        return self._step_forward(prepared[1]).to(torch.float32, copy=True)  # not a graph's

    def _prepare(self, plan: StepPlan) -> tuple[list[RequestState], StepInputs] | None:
        if plan.released:
            self._states.release(plan.released)
        if self._draft is not None:
            self._draft.prepare(plan)
        self.kv.swap_out(plan.swap_out)
        self.kv.swap_in(plan.swap_in)
        self.kv.copy_blocks(plan.copy_blocks)
        if not plan.seqs:
            return None
        states = self._states.apply(plan.seqs)
        inputs = self._inputs(plan.seqs, states, plan.reads_hidden)
        if self.max_stream_len:
            inputs.streaming = streaming_inputs(states, inputs)
        return states, inputs

    def _inputs(
        self, seqs: tuple[SeqWork, ...], states: list[RequestState], hidden: bool
    ) -> StepInputs:
        tables, lora = self._states.tables, self._states.has_adapters
        return build_step_inputs(
            seqs, states, tables, self.block_size, reads_hidden=hidden, adapters=lora
        )

    def close(self) -> None:
        """Drop the graphs, caches and state; free the pools' storages and, when the runner owns
        the model, the weights' (gpu/sleep_mode.ModelSleeper.release): reusable at once."""
        if self._draft is not None:
            self._draft.close()
        self.sleeper.release(weights=self._owns_model)  # steps ahead and graphs go first
        self._states.clear()
