"""The runner contract: what the Executor drives. A runner owns the model and the KV pools."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import msgspec
from troupe.config import EngineConfig
from troupe.messages import FailedSeq, PromptLogprobs, SampledToken, StepPlan, TokenMasks
from troupe.messages.engine_calls import WeightsErrorCode
from troupe.messages.pooling import Pooled
from troupe.messages.sleep_calls import SleepTag

if TYPE_CHECKING:  # torch: a fake-runner engine never imports it
    from troupe.gpu.lora_runtime import AdapterStore
    from troupe.gpu.weight_update import WeightReload


class SequencesFailed(Exception):
    """Raised by Runner.execute when the step ran but some sequences could not be sampled
    (non-finite logits). It carries the step's answer: the other sequences' tokens (in plan
    order) and the failed ones; the executor sends both in one StepResult.

    An exception rather than a second return value: every caller that only wants tokens (tests,
    benchmarks) keeps the one-tuple contract and still cannot miss a failure.
    """

    def __init__(self, sampled: tuple[SampledToken, ...], failed: tuple[FailedSeq, ...]) -> None:
        names = ", ".join(f"{f.request_id!r} ({f.reason})" for f in failed)
        super().__init__(f"no token for {names}")
        self.sampled = sampled
        self.failed = failed


class HiddenOutputs(msgspec.Struct, frozen=True, kw_only=True):
    """What steps read from final hidden states beyond the sampled tokens (gpu/hidden_rows.py)."""

    prompt_logprobs: tuple[PromptLogprobs, ...] = ()
    embeddings: tuple[Pooled, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerStats:
    """A runner's counts since it started: a snapshot, like trio's channel statistics()."""

    num_steps: int = 0  # execute() calls
    num_overlapped: int = 0  # decode steps launched before their plan arrived (gpu/overlap.py)
    num_overlap_hits: int = 0  # ... whose plan matched, so their samples answered it
    num_overlap_splits: int = 0  # ... hits whose plan also had other work (gpu/overlap.py)
    num_overlap_merges: int = 0  # ... splits whose chunks joined the next step (overlap_merge)
    num_draft_rounds: int = 0  # a draft model's rounds: catch-up forwards (gpu/draft_runner.py)
    num_draft_tokens: int = 0  # ... and the tokens it proposed in them
    num_kv_blocks_sent: int = 0  # disaggregation: KV blocks sent to the other side (all layers)
    num_kv_blocks_received: int = 0  # ... and received from it (gpu/kv_transfer.py)


class Runner(Protocol):
    """Executes step plans. Called from one worker thread, never concurrently."""

    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    vocab_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    # Positions past each decoding request's tokens the scheduler must keep in its block table:
    # 1 when the runner overlaps (it writes the next step's KV before that plan arrives).
    num_lookahead_tokens: int
    # Every layer's sliding window (the widest) in tokens, 0 when some layer attends to all:
    # the scheduler releases blocks wholly behind it while a request runs.
    kv_window: int
    # The device pool is ordinary memory that the OS commits page by page as blocks are first
    # written (the CPU pool): the allocator then reuses written blocks before fresh ones.
    kv_pages_on_write: bool
    # The longest a StreamingLLM request (SamplingParams.streaming_window) may run, prompt and
    # output; 0: this runner has no streaming attention (admission refuses such requests).
    max_stream_len: int

    @property
    def lora(self) -> AdapterStore | None:
        """Its LoRA adapters (gpu/lora_runtime.py), which the engine adds and retires at run
        time (actors/lora_registry.py); None: this runner runs none."""
        ...

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        """Apply released, swap_out, swap_in, then compute plan.seqs; one token per sampled seq.

        Raises SequencesFailed (with the others' tokens) when some sequences get no token."""
        ...

    def launch(self, plan: StepPlan) -> None:
        """Start a plan that `awaits_masks`: released, swaps and the forward pass, no sampling
        (on CUDA the forward runs while the grammar actor computes the masks)."""
        ...

    def finish(self, masks: TokenMasks) -> tuple[SampledToken, ...]:
        """Sample the launched plan with the grammar's masks; as execute's answer."""
        ...

    def take_hidden_outputs(self) -> HiddenOutputs:
        """The prompt chunks scored (SeqWork.num_scored) and the embeddings pooled
        (SeqWork.pools) since the last call, each once: the executor takes them with each
        step's tokens."""
        ...

    def statistics(self) -> RunnerStats:
        """Counts so far (benchmarks, diagnostics); a frozen snapshot, safe to keep."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class DrawsAhead(Protocol):
    """A runner that can draw a masked step before its plan comes (EngineConfig.
    draw_masked_ahead): the executor hands it masks filled ahead while no plan is launched."""

    def draw_ahead(self, masks: TokenMasks) -> None:
        """Draw the kept forward under `masks` if they are its rows; the plan that follows then
        takes the draw (launch) and finish returns it. Nothing otherwise."""
        ...


class WeightsRefused(ValueError):
    """A weight update that cannot be done (`code`: why; the message names what does not
    match). Nothing was copied, unless `code` is FAILED."""

    def __init__(self, message: str, code: WeightsErrorCode = WeightsErrorCode.INVALID) -> None:
        super().__init__(message)
        self.code = code


@runtime_checkable
class ReloadsWeights(Protocol):
    """A runner whose weights can be replaced in place (Engine.update_weights_from_disk)."""

    @property
    def weights(self) -> WeightReload: ...


class Sleeper(Protocol):
    """Gives a runner's device memory back and takes it again (sleep mode: gpu/sleep_mode.py,
    gpu/fake_sleep.py). Called between steps, with no request live."""

    @property
    def sleeping(self) -> tuple[SleepTag, ...]:
        """What sleeps now (in ALL_TAGS order); () when awake."""
        ...

    @property
    def level(self) -> int:
        """The level of the sleep under way; 0 when awake."""
        ...

    def sleep(self, level: int) -> str:
        """Level 1: weights to CPU memory; 2: weights dropped; both: the KV pools dropped
        (their contents too). What was freed; gpu/sleep_state.SleepRefused, with nothing
        freed, where it cannot."""
        ...

    def wake_up(self, tags: tuple[SleepTag, ...]) -> str:
        """Bring back the sleeping `tags` (each asleep): weights (level 1 their values, level
        2 memory for new ones), the KV pools (empty). What was allocated."""
        ...


@runtime_checkable
class SleepsRunner(Protocol):
    """A runner with sleep mode (EngineConfig.enable_sleep_mode)."""

    @property
    def sleeper(self) -> Sleeper: ...


def build_runner(config: EngineConfig) -> Runner:
    """The runner the config asks for. Imports lazily: the fake runner needs no torch model."""
    if config.runner == "fake":
        from troupe.gpu.fake_runner import FakeRunner

        fake = FakeRunner.from_config(config)
        if config.enable_sleep_mode:  # the fake model's KV dropped and brought back
            from troupe.gpu.fake_sleep import SleepyFakeRunner

            return SleepyFakeRunner(fake)
        return fake
    if config.tensor_parallel_size > 1:  # one worker process per rank (gpu/tp_runner.py)
        from troupe.gpu.tp_runner import TPRunner

        return TPRunner(config)
    if config.pipeline_parallel_size > 1:  # one worker process per stage (gpu/pp_runner.py)
        from troupe.gpu.pp_runner import PPRunner

        return PPRunner(config)
    from troupe.gpu.model_runner import ModelRunner

    return ModelRunner.from_config(config)
