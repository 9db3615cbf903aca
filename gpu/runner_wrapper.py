"""RunnerWrapper: a Runner that passes everything to the runner it wraps.

The wrappers (FaultyRunner: faults and held steps; TimedRunner: the step timeline; the page
tests' ScriptedRunner) change one or two calls; the pool sizes, the model's numbers and every
call they leave alone come from `inner`, here once.
"""

from __future__ import annotations

from troupe.gpu.runner import HiddenOutputs, Runner, RunnerStats
from troupe.messages import SampledToken, StepPlan, TokenMasks


class RunnerWrapper:
    """Delegates to `inner`; subclasses override what they change."""

    def __init__(self, inner: Runner) -> None:
        self.inner = inner
        self.block_size = inner.block_size
        self.num_gpu_blocks = inner.num_gpu_blocks
        self.num_cpu_blocks = inner.num_cpu_blocks
        self.vocab_size = inner.vocab_size
        self.max_model_len = inner.max_model_len
        self.eos_token_ids = inner.eos_token_ids
        self.num_lookahead_tokens = inner.num_lookahead_tokens
        self.kv_pages_on_write = inner.kv_pages_on_write
        self.lora = inner.lora
        self.kv_window = inner.kv_window
        self.max_stream_len = inner.max_stream_len

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        return self.inner.execute(plan)

    def launch(self, plan: StepPlan) -> None:
        self.inner.launch(plan)

    def finish(self, masks: TokenMasks) -> tuple[SampledToken, ...]:
        return self.inner.finish(masks)

    def take_hidden_outputs(self) -> HiddenOutputs:
        return self.inner.take_hidden_outputs()

    def statistics(self) -> RunnerStats:
        return self.inner.statistics()

    def close(self) -> None:
        self.inner.close()
