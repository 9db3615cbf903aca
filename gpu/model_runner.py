"""ModelRunner: the real Runner. Owns the model, the KV pools and per-request state.

Speculative continuation (on CUDA by default; TROUPE_SPECULATE=1/0 forces it on/off): when a
step samples every sequence it ran, the runner launches the next decode step of those
sequences right away, before its plan arrives, so the GPU computes while the actors plan:

    execute(plan N):   forward N, sample N, tolist | launch N+1 (inputs: N's samples, pos + 1)
    actors:                                         | update, plan, allocate  (GPU busy on N+1)
    execute(plan N+1): plan is "the same step"? yes: launch N+2 fed N+1's ids on the device,
                                                     then read N+1's ids (copied before N+2)
                                                no:  discard N+1, run plan N+1 normally

The scheduler gives decodes one lookahead position (num_lookahead_tokens), so the runner owns
the KV slot the speculated step writes.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import torch
from troupe.config import ConfigError, EngineConfig, resolve_model_path
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.cuda_graphs import DecodeGraphs
from troupe.gpu.kv_cache import (
    KVCache,
    block_bytes,
    blocks_from_free_memory,
    default_cpu_device_blocks,
)
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderModel
from troupe.gpu.request_states import LOGPROBS, RequestState, RequestStates
from troupe.gpu.sampler import sample
from troupe.gpu.sampling_batch import build_sampling_batch
from troupe.gpu.step_inputs import StepInputs, build_decode_inputs, build_step_inputs
from troupe.gpu.weights import load_model, read_config
from troupe.messages import SampledToken, StepPlan, TokenLogprob

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
    speculate: bool | None = None  # launch the next decode step early; None: on CUDA only


@dataclasses.dataclass(kw_only=True, eq=False)
class _Speculation:
    """A decode step launched before its plan arrived; its samples are still on the device."""

    rows: dict[str, int]  # request id -> row of the launched batch
    positions: np.ndarray  # int64 per row: the position the step computes
    token_ids: torch.Tensor  # int64 [rows] on the device: not read back yet
    host_ids: torch.Tensor  # their copy to (pinned) host memory, queued right after sampling
    copied: torch.cuda.Event | None  # recorded after that copy; None on the CPU
    input_tokens: list[int] = dataclasses.field(default_factory=list)  # per row: token fed

    def read(self) -> list[int]:
        """The sampled ids on the host; waits for this step only, not for work queued later."""
        if self.copied is not None:
            self.copied.synchronize()
        out: list[int] = self.host_ids.tolist()
        return out


def speculate_from_env() -> bool | None:
    """TROUPE_SPECULATE: '1' forces speculation on, '0' off; unset or '' leaves the default."""
    value = os.environ.get("TROUPE_SPECULATE", "")
    if value not in ("", "0", "1"):
        raise ConfigError(f"TROUPE_SPECULATE must be '0' or '1', got {value!r}")
    return None if value == "" else value == "1"


class ModelRunner:
    """Executes StepPlans on a DecoderModel over the paged KV cache; see gpu/runner.py."""

    def __init__(self, config: ModelConfig, model: DecoderModel, options: RunnerOptions) -> None:
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
            dtype=model.dtype,
            device=self.device,
        )
        self._rng = np.random.default_rng(options.seed)
        self._states = RequestStates(
            max_model_len=options.max_model_len,
            max_blocks_per_seq=self.max_blocks_per_seq,
            block_size=options.block_size,
            new_seed=lambda: int(self._rng.integers(0, 2**63 - 1)),
            capacity=options.max_num_seqs,
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
        self.speculate = (
            options.speculate if options.speculate is not None else self.device.type == "cuda"
        )
        # the scheduler keeps one position past each decode in its table: the speculated slot
        self.num_lookahead_tokens = 1 if self.speculate else 0
        self.num_speculated = 0  # speculative steps launched
        self.num_speculation_hits = 0  # ... whose plan matched, so their samples were used
        self._pending: _Speculation | None = None

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
        model_config, model = load_model(Path(path), dtype, device, max_model_len)
        num_gpu_blocks = config.num_kv_blocks
        if num_gpu_blocks is None and device.type == "cuda":
            peak = _profile_peak_bytes(model, config, max_model_len)
            num_gpu_blocks = blocks_from_free_memory(
                model_config, config.block_size, dtype, device, config.gpu_memory_utilization, peak
            )
        elif num_gpu_blocks is None:
            num_gpu_blocks = default_cpu_device_blocks(
                model_config, config.block_size, dtype, config.max_num_seqs
            )
        num_cpu_blocks = config.num_cpu_blocks
        if num_cpu_blocks is None:
            per_block = block_bytes(model_config, config.block_size, dtype)
            num_cpu_blocks = int(config.cpu_swap_gib * 2**30) // per_block
        options = RunnerOptions(
            block_size=config.block_size,
            num_gpu_blocks=num_gpu_blocks,
            num_cpu_blocks=num_cpu_blocks,
            max_num_seqs=config.max_num_seqs,
            max_model_len=max_model_len,
            seed=config.seed,
            enforce_eager=config.enforce_eager,
            speculate=speculate_from_env(),
        )
        return cls(model_config, model, options)

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        """Apply released, swap_out, swap_in, then run plan.seqs; one token per sampled seq."""
        pending, self._pending = self._pending, None
        if pending is not None:
            if not plan.seqs and not plan.swap_out and not plan.swap_in:
                # Only releases: the speculated step is still the next one to run.
                self._states.release(plan.released)
                self._pending = pending
                return ()
            rows = _matching_rows(plan, pending)
            if rows is not None:
                return self._take(plan, pending, rows)
            # Discard. The speculated step only wrote KV at position pos+1 of each of its
            # requests, in blocks their tables own (the lookahead). A request that continues
            # computes that slot again in this plan or a later one, with the same token and
            # context: the same value. A request that ended never reads it, and the block is
            # not full of committed tokens, so the prefix cache never hands it out; when the
            # block is reused, its new owner writes a slot before reading it. Everything below
            # (swap copies included) runs on the same CUDA stream after the speculated step,
            # so a swap-out reads its blocks after that write and a reused block is written
            # after it. Its samples are dropped; the state it advanced (num_tokens, history at
            # pos+1) is rewritten by this plan's SeqWorks, position-indexed and idempotent.
        prepared = self._prepare(plan)
        if prepared is None:
            return ()
        states, inputs = prepared
        logits = self._forward(inputs)
        rows = inputs.sampled_rows.tolist()
        if not rows:
            return ()  # mid-prompt chunks only: the cache is filled, nothing is sampled
        token_ids, logprobs = self._sample(logits, [states[r] for r in rows])
        if self.speculate and len(rows) == len(plan.seqs):
            # every sequence sampled: its next step is a decode of the token just sampled
            next_pos = inputs.seq_lens.astype(np.int64)
            request_ids = [w.request_id for w in plan.seqs]
            self._pending = self._launch(states, next_pos, request_ids, token_ids)
        return tuple(
            SampledToken(plan.seqs[r].request_id, token, logprob)
            for r, token, logprob in zip(rows, token_ids, logprobs, strict=True)
        )

    def _sample(
        self, logits: torch.Tensor, states: list[RequestState]
    ) -> tuple[list[int], tuple[TokenLogprob | None, ...]]:
        """Token ids (one device->host copy: waits for the step) and logprobs of the rows."""
        batch = build_sampling_batch(states, self.vocab_size, self.device)
        token_ids, logprobs = sample(logits, batch)
        return token_ids.tolist(), logprobs

    def _take(
        self, plan: StepPlan, pending: _Speculation, rows: list[int]
    ) -> tuple[SampledToken, ...]:
        """The plan is the speculated step (or a subset of it): use its samples."""
        if plan.released:
            self._states.release(plan.released)  # ended requests drop out: samples discarded
        # The plan's block_ids are lookahead blocks for the step after; its tokens and
        # positions are what the speculated step already wrote.
        states = self._states.apply(plan.seqs)
        self.num_speculation_hits += 1
        next_pos = pending.positions[rows] + 1
        request_ids = [w.request_id for w in plan.seqs]
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
        launched = pending.read()  # waits for the speculated step's samples
        token_ids = [launched[r] for r in rows]
        if early:
            if following is not None:
                following.input_tokens = token_ids
        else:
            following = self._launch(states, next_pos, request_ids, token_ids)
        self._pending = following
        return tuple(
            SampledToken(rid, token, None)
            for rid, token in zip(request_ids, token_ids, strict=True)
        )

    def _launch(
        self,
        states: list[RequestState],
        next_pos: np.ndarray,
        request_ids: list[str],
        token_ids: list[int] | torch.Tensor,
    ) -> _Speculation | None:
        """Queue the decode of `token_ids` (host list, or device ids with no penalty state) at
        `next_pos`, one per state, and the copy of its samples to the host; wait for nothing.

        None when a table does not cover its next position (no lookahead block yet), past
        max_model_len, or when a request wants logprobs (those are read back synchronously).
        """
        num_seqs = len(states)
        num_blocks = np.fromiter((s.num_blocks for s in states), np.int64, num_seqs)
        if (next_pos >= self.max_model_len).any() or (
            num_blocks * self.block_size <= next_pos
        ).any():
            return None
        if any(s.param_row[LOGPROBS] >= 0 for s in states):
            return None
        # The fed tokens join the history exactly as the next plan's SeqWorks will put them
        # (a rewrite by position, so a discarded speculation leaves nothing wrong).
        positions = next_pos.tolist()
        if isinstance(token_ids, list):
            device_ids = None
            host_ids = np.asarray(token_ids, dtype=np.int64)
            for state, pos, token in zip(states, positions, token_ids, strict=True):
                state.num_tokens = pos + 1
                if state.tokens is not None:
                    state.tokens[pos] = token
        else:
            device_ids, host_ids = token_ids, np.zeros(num_seqs, dtype=np.int64)
            for state, pos in zip(states, positions, strict=True):
                assert state.tokens is None, "penalty history needs the fed tokens on the host"
                state.num_tokens = pos + 1
        slots = np.fromiter((s.slot for s in states), np.int64, num_seqs)
        inputs = build_decode_inputs(
            host_ids, next_pos, slots, num_blocks, self._states.tables, self.block_size
        )
        logits = self._forward(inputs, device_ids)
        batch = build_sampling_batch(states, self.vocab_size, self.device)
        ids_device, _ = sample(logits, batch)  # no logprobs asked: nothing is read back
        copied = None
        if self.device.type == "cuda":
            host = torch.empty(num_seqs, dtype=torch.int64, pin_memory=True)
            host.copy_(ids_device, non_blocking=True)
            copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
            copied.record()
        else:
            host = ids_device
        self.num_speculated += 1
        return _Speculation(
            rows={rid: i for i, rid in enumerate(request_ids)},
            positions=next_pos,
            token_ids=ids_device,
            host_ids=host,
            copied=copied,
            input_tokens=token_ids if isinstance(token_ids, list) else [],
        )

    def logits(self, plan: StepPlan) -> torch.Tensor:
        """Like execute, but return the fp32 logits [sampled seqs, vocab] instead of sampling."""
        self._pending = None  # stream order keeps its KV writes before this plan's
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
        inputs.input_ids: a speculated step fed the previous step's samples without a copy."""
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
        meta = _to_device(inputs, self.device)
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
        self._pending = None
        self._states.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _matching_rows(plan: StepPlan, pending: _Speculation) -> list[int] | None:
    """Rows of the speculated batch, in plan order, if the plan is the speculated step.

    Each SeqWork must be a plain decode of a speculated request, fed the token sampled for it
    with the position after, in the launch order; requests may drop out (they ended). No swaps.
    """
    if plan.swap_out or plan.swap_in:
        return None
    rows: list[int] = []
    previous = -1
    get, tokens, positions = pending.rows.get, pending.input_tokens, pending.positions.tolist()
    for work in plan.seqs:
        row = get(work.request_id)
        if (
            row is None
            or row <= previous
            or work.reset
            or not work.sample
            or work.params is not None
            or len(work.token_ids) != 1
            or work.token_ids[0] != tokens[row]
            or work.start_pos != positions[row]
        ):
            return None
        rows.append(row)
        previous = row
    return rows


def host_to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """An async copy on CUDA: a pageable source would make the copy wait for the stream."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        tensor = tensor.pin_memory().to(device, non_blocking=True)
    return tensor


def _to_device(inputs: StepInputs, device: torch.device) -> AttentionMetadata:
    def put(array: np.ndarray) -> torch.Tensor:
        return host_to_device(array, device)

    return AttentionMetadata(
        slot_mapping=put(inputs.slot_mapping),
        block_tables=put(inputs.block_tables),
        seq_lens=put(inputs.seq_lens),
        query_start_loc=put(inputs.query_start_loc),
        max_query_len=inputs.max_query_len,
        max_seq_len=inputs.max_seq_len,
        is_decode=inputs.is_decode,
        logits_indices=put(inputs.logits_indices),
    )


def _profile_peak_bytes(model: DecoderModel, config: EngineConfig, max_model_len: int) -> int:
    """Activation peak of a forward at max_num_batched_tokens (plus max_num_seqs logits)."""
    device = model.device
    block_size = config.block_size
    num_tokens = config.max_num_batched_tokens
    seq_len = min(num_tokens, max_model_len)
    num_seqs = -(-num_tokens // seq_len)
    blocks_per_seq = -(-seq_len // block_size)
    scratch = KVCache(
        model.config,
        num_gpu_blocks=num_seqs * blocks_per_seq,
        num_cpu_blocks=0,
        block_size=block_size,
        dtype=model.dtype,
        device=device,
    )
    lens = [min(seq_len, num_tokens - i * seq_len) for i in range(num_seqs)]
    positions = np.concatenate([np.arange(n) for n in lens])
    owner = np.repeat(np.arange(num_seqs), lens)
    tables = np.arange(num_seqs * blocks_per_seq, dtype=np.int32).reshape(num_seqs, -1)
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    num_logits = min(config.max_num_seqs, num_tokens)
    inputs = StepInputs(
        input_ids=np.zeros(num_tokens, dtype=np.int64),
        positions=positions,
        slot_mapping=tables[owner, positions // block_size] * block_size + positions % block_size,
        block_tables=tables,
        seq_lens=np.asarray(lens, dtype=np.int32),
        query_start_loc=qsl,
        logits_indices=np.arange(num_tokens - num_logits, num_tokens),
        sampled_rows=np.arange(num_logits),
        max_query_len=max(lens),
        max_seq_len=max(lens),
    )
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    try:
        hidden = model(
            torch.from_numpy(inputs.input_ids).to(device),
            torch.from_numpy(positions).to(device),
            _to_device(inputs, device),
            scratch.layers,
        )
        logits = model.compute_logits(hidden)
        logits.softmax(dim=-1).sort(dim=-1)  # the sampler's biggest temporaries
        torch.cuda.synchronize(device)
    except torch.OutOfMemoryError as exc:
        raise MemoryError(
            f"out of device memory in a forward of max_num_batched_tokens={num_tokens} tokens; "
            "lower max_num_batched_tokens or max_num_seqs"
        ) from exc
    peak = torch.cuda.max_memory_allocated(device) - before
    del hidden, logits, scratch
    torch.cuda.empty_cache()
    return int(peak)
