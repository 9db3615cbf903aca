"""What the engine process and the tensor-parallel workers say to each other (msgpack).

    driver (TPRunner, engine process) ── WorkerCommand ──► rank 0 ══ broadcast (gloo) ══► ranks
                                      ◄── WorkerReply ───  rank 0
                                      ◄── WorkerReady / WorkerFailed ── every rank (own pipe)

Every rank runs the same command on its shard; only rank 0 answers the step.
"""

from __future__ import annotations

import msgspec
from troupe.gpu.runner import HiddenOutputs
from troupe.messages import FailedSeq, SampledToken, StepPlan, TokenMasks


class Execute(msgspec.Struct, frozen=True, tag=True):
    plan: StepPlan


class Launch(msgspec.Struct, frozen=True, tag=True):
    plan: StepPlan


class Finish(msgspec.Struct, frozen=True, tag=True):
    masks: TokenMasks


class Close(msgspec.Struct, frozen=True, tag=True):
    pass


class LoadLora(msgspec.Struct, frozen=True, tag=True):
    """Every rank reads the PEFT folder at `path` and holds its cut as adapter `name`."""

    name: str
    path: str


class UnloadLora(msgspec.Struct, frozen=True, tag=True):
    """Every rank forgets adapter `name` (no request runs on it: actors/lora_registry.py)."""

    name: str


WorkerCommand = Execute | Launch | Finish | Close | LoadLora | UnloadLora


class WorkerReady(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A rank loaded its shard and built its runner; the numbers must agree across ranks."""

    rank: int
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    vocab_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    num_lookahead_tokens: int
    kv_window: int


class StepAnswer(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Rank 0's answer to Execute/Finish (Launch: empty), with its runner's counts."""

    sampled: tuple[SampledToken, ...] = ()
    failed: tuple[FailedSeq, ...] = ()  # non-empty: the runner raised SequencesFailed
    hidden: HiddenOutputs = msgspec.field(default_factory=HiddenOutputs)  # take_hidden_outputs()
    num_steps: int = 0
    num_overlapped: int = 0
    num_overlap_hits: int = 0
    num_overlap_splits: int = 0
    num_overlap_merges: int = 0
    num_kv_blocks_sent: int = 0  # disaggregation's workers (gpu/pd_worker.py)
    num_kv_blocks_received: int = 0


class WorkerFailed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A rank raised (start-up or a step): the message ends its engine."""

    rank: int
    error_type: str  # the exception's class name: ConfigError and ModelLoadError are raised
    message: str  # as themselves by the driver, anything else as TPWorkerError


class LoraAnswer(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Rank 0's answer to LoadLora / UnloadLora once every rank has run it: empty when all
    succeeded, else the first failing rank's error (a failed load is undone on every rank)."""

    rank: int = -1
    error_type: str = ""  # the exception's class name; "" when every rank succeeded
    message: str = ""


WorkerReply = WorkerReady | StepAnswer | WorkerFailed | LoraAnswer

command_encoder = msgspec.msgpack.Encoder()
command_decoder = msgspec.msgpack.Decoder(WorkerCommand)
reply_decoder = msgspec.msgpack.Decoder(WorkerReply)
