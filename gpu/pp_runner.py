"""PPRunner: the Runner the executor drives when pipeline_parallel_size > 1.

A WorkerRunner (gpu/worker_runner.py: the spawning, the pipes, the failure handling, shared
with tensor parallelism) whose workers each hold one pipeline stage (gpu/pp_worker.py):

    executor thread ─ execute(plan) ─► PPRunner ══ pipe ══► stage 0 ══ gloo broadcast ══► 1..P-1
                    ◄── tokens ──────          ◄══ answer ══ stage P-1
    every stage runs the plan: stage 0 embeds, hidden states go stage to stage (send/recv on
    the model group), the last stage's logits are broadcast, every stage samples the same

One batch is in flight at a time: stage s idles while the others compute (vLLM overlaps
micro-batches across stages with virtual engines: not built). A failed or exited stage raises
PPStageError ("pipeline stage failed: stage 1 exited with code -9"), and the engine turns
dead (a RunnerDead, gpu/runner_dead.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from troupe.config import ConfigError, EngineConfig, resolve_model_path
from troupe.gpu.pp_stage import check_pipeline_parallel
from troupe.gpu.pp_worker import build_stage_runner
from troupe.gpu.runner_dead import RunnerDead
from troupe.gpu.runner_setup import uses_cuda
from troupe.gpu.weights import read_config
from troupe.gpu.worker_runner import WorkerRunner, WorkerSpec


class PPStageError(RunnerDead):
    """A pipeline stage failed or exited; the engine cannot step any more (a RunnerDead: the
    engine turns dead, gpu/runner_dead.py)."""


class PPRunner(WorkerRunner):
    """Drives pipeline_parallel_size stage processes; see the module docstring."""

    def __init__(self, config: EngineConfig) -> None:
        size = config.pipeline_parallel_size
        full = read_config(Path(resolve_model_path(config.model)), config.hf_overrides)
        check_pipeline_parallel(full, size, config.pipeline_layer_partition)  # before spawning
        if uses_cuda(config) and torch.cuda.device_count() < size:
            raise ConfigError(
                f"pipeline_parallel_size ({size}) exceeds the CUDA devices torch sees "
                f"({torch.cuda.device_count()})"
            )
        spec = WorkerSpec(
            size=size,
            build=build_stage_runner,
            answer_rank=size - 1,  # the last stage samples first-hand (and holds the hidden rows)
            failure="pipeline stage failed",
            unit="stage",
            error=PPStageError,
            process_name="troupe-pp-stage",
        )
        super().__init__(config, spec)
