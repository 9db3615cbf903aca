"""ModelRunner: the real Runner. Owns the model, the KV pools and per-request state.

It runs each StepPlan: prepare the state, forward, sample. Before that it asks its
DecodeOverlap (gpu/overlap.py) whether a decode step launched early already answers the plan,
and after a step that sampled every sequence it lets the DecodeOverlap launch the next one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from troupe.config import ConfigError, EngineConfig, resolve_model_path
from troupe.gpu.activation_profile import profile_activation_peak
from troupe.gpu.cuda_graphs import DecodeGraphs
from troupe.gpu.device_inputs import device_metadata, host_to_device
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.mixed_graphs import MixedGraphs
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderModel
from troupe.gpu.overlap import DecodeOverlap, LogitsHook, Split
from troupe.gpu.pool_sizing import blocks_from_free_memory, cpu_device_blocks, swap_pool_blocks
from troupe.gpu.request_states import RequestState, RequestStates
from troupe.gpu.runner import RunnerStats
from troupe.gpu.sampler import WITHHELD, sample, sampled_tokens, withhold_non_finite
from troupe.gpu.sampling_batch import build_sampling_batch
from troupe.gpu.spec_verify import verify_proposals
from troupe.gpu.step_inputs import StepInputs, build_step_inputs
from troupe.gpu.token_bitmask import BitmaskUpload, step_bitmask
from troupe.gpu.weights import load_model, read_config
from troupe.kernels.kv_quant import FP8_DTYPE
from troupe.messages import SampledToken, SeqWork, StepPlan, TokenLogprob, TokenMasks

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def kv_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV pools' element type: e4m3 for "fp8", else the model's."""
    return FP8_DTYPE if kv_cache_dtype == "fp8" else model_dtype


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerOptions:
    """The engine settings the runner needs, resolved (no 'auto', no None pools)."""

    block_size: int = 16
    num_gpu_blocks: int
    num_cpu_blocks: int = 0
    max_num_seqs: int = 256
    max_model_len: int
    seed: int = 0
    enforce_eager: bool = True
    # steps with prefill chunks replay CUDA graphs too (gpu/mixed_graphs.py), up to this many
    # tokens; 0: they run eagerly
    mixed_graph_tokens: int = 0
    overlap_schedule: bool = False  # launch each decode step before its plan (gpu/overlap.py)
    num_speculative_tokens: int = 0  # proposals per sequence a step may verify
    kv_cache_dtype: str = "auto"  # "fp8": e4m3 blocks with per layer and KV head scales


class ModelRunner:
    """Executes StepPlans on a DecoderModel over the paged KV cache; see gpu/runner.py."""

    def __init__(
        self,
        config: ModelConfig,
        model: DecoderModel,
        options: RunnerOptions,
        *,
        logits_hook: LogitsHook | None = None,
    ) -> None:
        """`logits_hook`: a test seam that may change each step's logits before sampling (fault
        injection: a NaN row must fail its request only); the engine never sets it."""
        self.model_config = config
        self.model = model
        self.device = model.device
        self.block_size = options.block_size
        self.num_gpu_blocks = options.num_gpu_blocks
        self.num_cpu_blocks = options.num_cpu_blocks
        self.vocab_size = config.vocab_size
        self.max_model_len = options.max_model_len
        self.eos_token_ids = config.eos_token_ids
        self.max_blocks_per_seq = -(-options.max_model_len // options.block_size)
        self.kv = KVCache(
            config,
            num_gpu_blocks=options.num_gpu_blocks,
            num_cpu_blocks=options.num_cpu_blocks,
            block_size=options.block_size,
            dtype=kv_dtype(options.kv_cache_dtype, model.dtype),
            device=self.device,
        )
        model.set_kv_scales(self.kv.scales)
        self._rng = np.random.default_rng(options.seed)
        self._states = RequestStates(
            max_model_len=options.max_model_len,
            max_blocks_per_seq=self.max_blocks_per_seq,
            block_size=options.block_size,
            new_seed=lambda: int(self._rng.integers(0, 2**63 - 1)),
            capacity=options.max_num_seqs,
            eos_token_ids=tuple(config.eos_token_ids),
        )
        self._graphs: DecodeGraphs | None = None
        if self.device.type == "cuda" and not options.enforce_eager:
            self._graphs = DecodeGraphs(
                model,
                self.kv.layers,
                max_num_seqs=options.max_num_seqs,
                max_blocks_per_seq=self.max_blocks_per_seq,
                max_model_len=options.max_model_len,
            )
        self._mixed: MixedGraphs | None = None
        if self._graphs is not None and options.mixed_graph_tokens > 0:
            self._mixed = MixedGraphs(
                model,
                self.kv.layers,
                max_num_seqs=options.max_num_seqs,
                max_num_tokens=options.mixed_graph_tokens,
                max_logits_per_seq=1 + options.num_speculative_tokens,
                max_blocks_per_seq=self.max_blocks_per_seq,
                max_model_len=options.max_model_len,
            )
        self.overlap_schedule = options.overlap_schedule
        # the scheduler keeps one position past each decode in its table: the overlapped slot
        self.num_lookahead_tokens = 1 if options.overlap_schedule else 0
        self.kv_window = config.kv_window
        self._num_steps = 0
        self._overlap = DecodeOverlap(
            self._states,
            self._forward,
            device=self.device,
            block_size=options.block_size,
            max_model_len=options.max_model_len,
            vocab_size=config.vocab_size,
            logits_hook=logits_hook,
        )
        self._logits_hook = logits_hook
        self.kv.reset_scales()  # graph captures wrote made-up KV: the first real write sets them
        # a plan launched by launch(), awaiting its grammar masks: (plan, states, inputs, logits)
        self._launched: tuple[StepPlan, list[RequestState], StepInputs, torch.Tensor] | None
        self._launched = None
        self._upload_bitmask = BitmaskUpload(self.device)

    def statistics(self) -> RunnerStats:
        """Steps run and overlapped steps launched and used, so far."""
        return RunnerStats(
            num_steps=self._num_steps,
            num_overlapped=self._overlap.num_overlapped,
            num_overlap_hits=self._overlap.num_overlap_hits,
            num_overlap_splits=self._overlap.num_overlap_splits,
        )

    @classmethod
    def from_config(cls, config: EngineConfig) -> ModelRunner:
        """Load config.model (default GGUF when None) and size the pools from the config."""
        path = resolve_model_path(config.model)
        device = torch.device(
            "cuda"
            if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
            else "cpu"
        )
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device is 'cuda' but torch sees no CUDA device")
        if config.dtype == "auto":
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        else:
            dtype = _DTYPES[config.dtype]
        model_config = read_config(Path(path))
        max_model_len = config.max_model_len or model_config.max_position_embeddings
        if max_model_len > model_config.max_position_embeddings:
            raise ConfigError(
                f"max_model_len {max_model_len} exceeds the model's "
                f"max_position_embeddings {model_config.max_position_embeddings}"
            )
        model_config, model = load_model(
            Path(path), dtype, device, max_model_len, config.kernel_backend, config.quantization
        )
        cache_dtype = kv_dtype(config.kv_cache_dtype, dtype)  # what the pools are sized in
        # A CPU step runs synchronously: launching the next one early overlaps nothing.
        overlap = config.enable_overlap_schedule and device.type == "cuda"
        num_gpu_blocks = config.num_kv_blocks
        if num_gpu_blocks is None and device.type == "cuda":
            peak = profile_activation_peak(model, config, max_model_len)
            num_gpu_blocks = blocks_from_free_memory(
                model_config,
                config.block_size,
                cache_dtype,
                device,
                config.gpu_memory_utilization,
                peak,
            )
        elif num_gpu_blocks is None:
            num_gpu_blocks = cpu_device_blocks(
                model_config, config, cache_dtype, max_model_len=max_model_len
            )
        num_cpu_blocks = config.num_cpu_blocks
        if num_cpu_blocks is None:
            num_cpu_blocks = swap_pool_blocks(
                model_config, config, cache_dtype, device, num_gpu_blocks=num_gpu_blocks
            )
        options = RunnerOptions(
            block_size=config.block_size,
            num_gpu_blocks=num_gpu_blocks,
            num_cpu_blocks=num_cpu_blocks,
            max_num_seqs=config.max_num_seqs,
            max_model_len=max_model_len,
            seed=config.seed,
            # the reference ops sync with the host (tolist): no CUDA graphs for them
            enforce_eager=config.enforce_eager or config.kernel_backend == "torch",
            mixed_graph_tokens=min(config.max_mixed_graph_tokens, config.max_num_batched_tokens),
            overlap_schedule=overlap,
            num_speculative_tokens=config.num_proposals,
            kv_cache_dtype=config.kv_cache_dtype,
        )
        return cls(model_config, model, options)

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        """Apply released, swap_out, swap_in, then run plan.seqs; one token per sampled seq."""
        self._num_steps += 1
        taken = self._overlap.take(plan)
        if isinstance(taken, Split):
            return self._run_split(taken)
        if taken is not None:
            return taken  # the pending overlapped step answered it (or only releases)
        prepared = self._prepare(plan)
        if prepared is None:
            return ()
        states, inputs = prepared
        return self._run(plan.seqs, states, inputs, self._forward(inputs))

    def launch(self, plan: StepPlan) -> None:
        """Run a plan that awaits grammar masks up to its logits; finish() samples it."""
        self._num_steps += 1
        self._overlap.discard()  # its samples were drawn without masks
        prepared = self._prepare(plan)
        self._launched = None
        if prepared is not None:
            states, inputs = prepared
            self._launched = (plan, states, inputs, self._forward(inputs))

    def finish(self, masks: TokenMasks) -> tuple[SampledToken, ...]:
        """Sample the launched plan under `masks` (no overlapped launch after it)."""
        launched, self._launched = self._launched, None
        if launched is None:
            return ()
        plan, states, inputs, logits = launched
        return self._run(plan.seqs, states, inputs, logits, masks=masks)

    def _run(
        self,
        seqs: tuple[SeqWork, ...],
        states: list[RequestState],
        inputs: StepInputs,
        logits: torch.Tensor,
        *,
        split: Split | None = None,
        masks: TokenMasks | None = None,
    ) -> tuple[SampledToken, ...]:
        """Sample `seqs` from their `logits` (under grammar `masks` if given); with a split, its
        decodes' tokens go first. Then, without masks, launch the next decode of every row
        that sampled (a chunk that did not joins later)."""
        rows = inputs.sampled_rows.tolist()
        if inputs.num_logits is not None:  # proposals to verify: no overlap after this step
            assert split is None, "a split never carries proposals (overlap._split_rows)"
            return verify_proposals(
                seqs,
                states,
                rows,
                inputs.num_logits,
                logits,
                vocab_size=self.vocab_size,
                logits_hook=self._logits_hook,
            )
        request_ids = [seqs[r].request_id for r in rows]
        token_ids: list[int] = []
        logprobs: tuple[TokenLogprob | None, ...] = ()
        if rows:
            if self._logits_hook is not None:
                with torch.inference_mode():  # the logits are inference tensors: edits need it
                    self._logits_hook(request_ids, logits)
            bitmask = None if masks is None else step_bitmask(masks, request_ids)
            token_ids, logprobs = self._sample(logits, [states[r] for r in rows], bitmask)
        next_pos = inputs.seq_lens[rows].astype(np.int64)
        sampled = [states[r] for r in rows] if masks is None else []
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
        inputs = build_step_inputs(split.extras, states, self._states.tables, self.block_size)
        return self._run(split.extras, states, inputs, self._forward(inputs), split=split)

    def _sample(
        self, logits: torch.Tensor, states: list[RequestState], bitmask: np.ndarray | None = None
    ) -> tuple[list[int], tuple[TokenLogprob | None, ...]]:
        """Token ids (one device->host copy: waits for the step; WITHHELD for a row whose logits
        are not finite) and logprobs of the rows."""
        batch = build_sampling_batch(states, self.vocab_size, self.device)
        if bitmask is not None:
            batch.token_bitmask = self._upload_bitmask(bitmask)
        token_ids, logprobs = sample(logits, batch)
        return withhold_non_finite(token_ids, logits).tolist(), logprobs

    def logits(self, plan: StepPlan) -> torch.Tensor:
        """Like execute, but return the fp32 logits [sampled seqs, vocab] instead of sampling."""
        self._overlap.discard()  # stream order keeps its KV writes before this plan's
        prepared = self._prepare(plan)
        if prepared is None:
            return torch.empty(0, self.vocab_size, device=self.device)
        return self._forward(prepared[1]).clone()

    def _prepare(self, plan: StepPlan) -> tuple[list[RequestState], StepInputs] | None:
        if plan.released:
            self._states.release(plan.released)
        self.kv.swap_out(plan.swap_out)
        self.kv.swap_in(plan.swap_in)
        if not plan.seqs:
            return None
        states = self._states.apply(plan.seqs)
        inputs = build_step_inputs(plan.seqs, states, self._states.tables, self.block_size)
        return states, inputs

    def _forward(self, inputs: StepInputs, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits of the sampled rows, in order. `input_ids` (on the device) replaces
        inputs.input_ids: an overlapped step fed the previous step's samples without a copy."""
        if (
            self._graphs is not None
            and inputs.is_decode
            and self._graphs.can_run(len(inputs.seq_lens))
        ):
            logits: torch.Tensor = self._graphs.run(inputs, input_ids)
            if len(inputs.sampled_rows) == len(inputs.seq_lens):
                return logits  # every row samples, in order: no gather, no copy
            picked: torch.Tensor = logits[host_to_device(inputs.sampled_rows, self.device)]
            return picked
        if self._mixed is not None and not inputs.is_decode and self._mixed.can_run(inputs):
            return self._mixed.run(inputs)
        meta = device_metadata(inputs, self.device)
        hidden = self.model(
            host_to_device(inputs.input_ids, self.device) if input_ids is None else input_ids,
            host_to_device(inputs.positions, self.device),
            meta,
            self.kv.layers,
        )
        out: torch.Tensor = self.model.compute_logits(hidden)
        return out

    def close(self) -> None:
        """Drop the graphs, caches and state so device memory can be reused."""
        self._graphs = None
        self._overlap.discard()
        self._states.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
