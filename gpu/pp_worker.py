"""One pipeline stage's ModelRunner, built in its worker process (gpu/tp_worker.worker_main
runs it with this builder; gpu/pp_runner.py spawns the stages).

Each stage loads only its layers (gpu/pp_weights.py) and sizes a KV pool of only those
layers; the block counts are min-reduced over the stages (tp_worker.group_options, as TP's
ranks), so the scheduler plans one pool for all. CUDA graphs and the overlapped decode are off: a captured graph would hold the stage's
send/recv, and an early-launched step would put two steps' messages in flight (not built).
"""

from __future__ import annotations

from pathlib import Path

from troupe.config import EngineConfig, resolve_model_path
from troupe.gpu.model_runner import ModelRunner
from troupe.gpu.pp_model import PPStageModel
from troupe.gpu.pp_stage import PPStage, check_pipeline_parallel
from troupe.gpu.pp_weights import load_stage
from troupe.gpu.runner_setup import checked_max_model_len, model_dtype
from troupe.gpu.tp_group import TPGroup
from troupe.gpu.tp_worker import group_options
from troupe.gpu.weights import mxfp4_unpacked, read_config


def build_stage_runner(config: EngineConfig, group: TPGroup) -> ModelRunner:
    """Load this stage's layers and size its pools (the same block counts on every stage)."""
    config = config.replace(enforce_eager=True, enable_overlap_schedule=False)
    path = Path(resolve_model_path(config.model))
    full = mxfp4_unpacked(read_config(path, config.hf_overrides))  # stages expand them all
    size, partition = group.world_size, config.pipeline_layer_partition
    check_pipeline_parallel(full, size, partition)
    stage = PPStage.of(full, group.rank, size, partition)
    device = group.device
    dtype = model_dtype(config, device)
    max_model_len = checked_max_model_len(config, full)
    model = PPStageModel(stage, full, group, dtype, device, max_model_len, config.kernel_backend)
    load_stage(model, path, full)
    model.eval()
    layers = model.config  # the stage's layers: its pool holds only theirs
    options = group_options(config, group, model, layers, max_model_len)
    return ModelRunner(layers, model, options, owns_model=True)
