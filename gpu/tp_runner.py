"""TPRunner: the Runner the executor drives when tensor_parallel_size > 1.

A WorkerRunner (gpu/worker_runner.py: the spawning, the pipes, the failure handling) whose
workers each load one rank's shard (gpu/tp_worker.build_rank_runner) and run the same step;
rank 0 answers:

    executor thread ─ execute(plan) ─► TPRunner ══ pipe ══► rank 0 ══ gloo broadcast ══► rank 1..
                    ◄── tokens ──────          ◄══ answer ══
                                      waits on: every rank's pipe + every rank's process sentinel

A failed or exited rank raises TPWorkerError ("tensor-parallel worker failed: rank 1 exited
with code -9"), and the engine turns dead (a RunnerDead, gpu/runner_dead.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from troupe.config import ConfigError, EngineConfig, resolve_model_path
from troupe.gpu.lora_adapter import load_adapter
from troupe.gpu.runner_dead import RunnerDead
from troupe.gpu.tp_lora_runtime import TPLoraClient
from troupe.gpu.tp_model import check_tensor_parallel
from troupe.gpu.tp_worker import build_rank_runner, rank_device
from troupe.gpu.weights import read_config
from troupe.gpu.worker_runner import STOP_GRACE_S, WorkerRunner, WorkerSpec

__all__ = ["STOP_GRACE_S", "TPRunner", "TPWorkerError"]


class TPWorkerError(RunnerDead):
    """A tensor-parallel worker failed or exited; the engine cannot step any more (a
    RunnerDead: the engine turns dead, gpu/runner_dead.py)."""


class TPRunner(WorkerRunner):
    """Drives tensor_parallel_size worker processes; see the module docstring."""

    def __init__(self, config: EngineConfig) -> None:
        size = config.tensor_parallel_size
        path = Path(resolve_model_path(config.model))
        full = read_config(path, config.hf_overrides)
        # before spawning anything, and the adapters:
        check_tensor_parallel(full, size, config.enable_expert_parallel)
        for name, folder in config.lora_adapters.items():  # each rank reads its cut again
            load_adapter(name, folder, full, config.max_lora_rank)
        if rank_device(config, 0).type == "cuda" and torch.cuda.device_count() < size:
            raise ConfigError(
                f"tensor_parallel_size ({size}) exceeds the CUDA devices torch sees "
                f"({torch.cuda.device_count()})"
            )
        spec = WorkerSpec(
            size=size,
            build=build_rank_runner,
            failure="tensor-parallel worker failed",
            error=TPWorkerError,
            process_name="troupe-tp-rank",
        )
        super().__init__(config, spec)
        if config.enable_lora or config.lora_modules:  # run-time loads reach every rank
            self.lora = TPLoraClient(self.lora_command)
