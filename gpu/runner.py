"""The runner contract: what the Executor drives. A runner owns the model and the KV pools."""

from __future__ import annotations

from typing import Protocol

from troupe.config import EngineConfig
from troupe.messages import SampledToken, StepPlan


class Runner(Protocol):
    """Executes step plans. Called from one worker thread, never concurrently."""

    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    vocab_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        """Apply released, swap_out, swap_in, then compute plan.seqs; one token per sampled seq."""
        ...

    def close(self) -> None: ...


def build_runner(config: EngineConfig) -> Runner:
    """The runner the config asks for. Imports lazily: the fake runner needs no torch model."""
    if config.runner == "fake":
        from troupe.gpu.fake_runner import FakeRunner

        return FakeRunner.from_config(config)
    from troupe.gpu.model_runner import ModelRunner

    return ModelRunner.from_config(config)
