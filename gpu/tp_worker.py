"""One tensor-parallel rank: its own process (spawned by gpu/tp_runner.py), its shard of the
model, its KV pool, and the same step loop on every rank.

    rank 0     reads a command from the engine's pipe, broadcasts it (gloo), runs it, answers
    rank r>0   receives the broadcast, runs it

Every rank runs the whole ModelRunner on its shard: the sharded model all-gathers the logits,
so every rank samples the same tokens (greedy, and seeded noise keyed by seed and position),
and its per-request state and overlapped steps (gpu/overlap.py) stay in step with rank 0's
without a token broadcast. Only rank 0 answers. Pipeline stages (gpu/pp_worker.py) run this
same loop with their own builder; their last stage answers.

A rank that raises sends WorkerFailed on its own pipe and exits; rank 0 reading the end of its
pipe (the engine process died) broadcasts Close, so no rank outlives the engine.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import torch
from troupe.config import ConfigError, EngineConfig, resolve_model_path
from troupe.gpu.activation_profile import profile_activation_peak
from troupe.gpu.model_config import ModelConfig, ModelLoadError
from troupe.gpu.model_runner import ModelRunner, kv_dtype
from troupe.gpu.models import DecoderModel
from troupe.gpu.pool_sizing import blocks_from_free_memory, cpu_device_blocks, swap_pool_blocks
from troupe.gpu.runner import SequencesFailed
from troupe.gpu.runner_setup import (
    RunnerOptions,
    checked_max_model_len,
    model_dtype,
    runner_options,
    uses_cuda,
)
from troupe.gpu.tp_group import TPGroup
from troupe.gpu.tp_lora import install_tp_lora
from troupe.gpu.tp_lora_runtime import run_lora_command
from troupe.gpu.tp_model import TPDecoderModel, TPShard, check_tensor_parallel
from troupe.gpu.tp_protocol import (
    Close,
    Execute,
    Finish,
    Launch,
    LoadLora,
    StepAnswer,
    UnloadLora,
    WorkerFailed,
    WorkerReady,
    command_decoder,
    command_encoder,
)
from troupe.gpu.tp_quant import kept_shards
from troupe.gpu.tp_weights import load_shard, open_shard_reader
from troupe.gpu.weights import read_config


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """cuda:rank on CUDA (one GPU per rank), else the CPU."""
    if uses_cuda(config):
        return torch.device("cuda", rank)
    return torch.device("cpu")


def build_rank_runner(config: EngineConfig, group: TPGroup) -> ModelRunner:
    """Load this rank's shard and size its pools (the same block counts on every rank)."""
    path = Path(resolve_model_path(config.model))
    full = read_config(path, config.hf_overrides)
    check_tensor_parallel(full, group.world_size, config.enable_expert_parallel)
    device = group.device
    dtype = model_dtype(config, device)
    max_model_len = checked_max_model_len(config, full)
    shard = TPShard(
        rank=group.rank,
        size=group.world_size,
        full=full,
        expert_parallel=config.enable_expert_parallel,
    )
    model = TPDecoderModel(shard, group, dtype, device, max_model_len, config.kernel_backend)
    with open_shard_reader(path) as reader:
        load_shard(model, reader, str(path), kept_shards(config, device))
    model.eval()
    install_tp_lora(model, config)  # before the memory profile: the slots count
    layers = shard.layer_config()  # the rank's KV heads: the pool holds only those
    options = group_options(config, group, model, layers, max_model_len)
    return ModelRunner(layers, model, options, owns_model=True)


def group_options(
    config: EngineConfig,
    group: TPGroup,
    model: DecoderModel,
    layers: ModelConfig,
    max_model_len: int,
) -> RunnerOptions:
    """The runner options of one rank whose pool holds `layers` (its KV heads, or a pipeline
    stage's layers): pools sized on this rank, then min-reduced over the group, so the
    scheduler plans one pool for all."""
    device = group.device
    cache_dtype = kv_dtype(config.kv_cache_dtype, model.dtype)
    num_gpu_blocks = config.num_kv_blocks
    if num_gpu_blocks is None and device.type == "cuda":
        peak = profile_activation_peak(model, config, max_model_len)  # collectives: all ranks
        num_gpu_blocks = blocks_from_free_memory(
            layers, config.block_size, cache_dtype, device, config.gpu_memory_utilization, peak
        )
    elif num_gpu_blocks is None:
        num_gpu_blocks = cpu_device_blocks(layers, config, cache_dtype, max_model_len=max_model_len)
    num_gpu_blocks = group.min_int(num_gpu_blocks)  # the scheduler plans one pool for all
    num_cpu_blocks = config.num_cpu_blocks
    if num_cpu_blocks is None:
        num_cpu_blocks = swap_pool_blocks(
            layers, config, cache_dtype, device, num_gpu_blocks=num_gpu_blocks
        )
    # the same seed on every rank: the same per-request sampling seeds
    return runner_options(
        config,
        device,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=group.min_int(num_cpu_blocks),
        max_model_len=max_model_len,
    )


def worker_main(
    rank: int,
    config: EngineConfig,
    world_size: int,
    init_file: str,
    conn: Connection,
    build: Callable[[EngineConfig, TPGroup], ModelRunner] = build_rank_runner,
    answer_rank: int = 0,
) -> None:
    """The process body of rank `rank` (a spawn target: importable, picklable arguments).
    `build` loads the rank's part of the model (a TP shard; a pipeline stage, gpu/pp_worker.py)
    and `answer_rank` is the rank that answers each step (gpu/worker_runner.py)."""
    # the engine process decides when ranks stop (Close, or the end of rank 0's pipe): a
    # Ctrl-C to the process group must not kill them under a draining engine
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    group: TPGroup | None = None
    runner: ModelRunner | None = None
    exit_code = 0
    try:
        device = rank_device(config, rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:  # the ranks share the host's cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        group = TPGroup.init(rank=rank, world_size=world_size, device=device, init_file=init_file)
        runner = build(config, group)
        conn.send_bytes(command_encoder.encode(worker_ready(rank, runner)))
        _serve(runner, group, conn, rank == answer_rank)
        group.barrier()  # every rank is out of its last collective before any tears down
    except BaseException as exc:  # reported to the engine, then this rank exits
        if not isinstance(exc, (ConfigError, ModelLoadError)):
            traceback.print_exc()  # the worker's stderr: the engine gets one line
        report_failure(conn, rank, exc)
        exit_code = 1
    finally:
        if runner is not None:
            runner.close()
        if group is not None and exit_code == 0:
            group.destroy()
    # no interpreter teardown: C++ destructors of the communication threads racing the
    # peers' exits can abort a process that has finished cleanly
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def _serve(runner: ModelRunner, group: TPGroup, conn: Connection, answers: bool) -> None:
    """Run commands until Close (or, on rank 0, the end of the engine's pipe); `answers`: this
    rank sends each step's answer."""
    while True:
        data = None
        if group.is_driver_rank:
            try:
                data = conn.recv_bytes()
            except (EOFError, OSError):  # the engine process is gone: stop every rank
                data = command_encoder.encode(Close())
        command = command_decoder.decode(group.broadcast_bytes(data))
        answer = StepAnswer()
        try:
            match command:
                case Close():
                    return
                case Execute(plan=plan):
                    answer = StepAnswer(sampled=runner.execute(plan))
                case Launch(plan=plan):
                    runner.launch(plan)
                case Finish(masks=masks):
                    answer = StepAnswer(sampled=runner.finish(masks))
                case LoadLora() | UnloadLora():  # between steps: gpu/tp_lora_runtime.py
                    reply = run_lora_command(runner.lora, group, command)
                    if answers:
                        conn.send_bytes(command_encoder.encode(reply))
                    continue
        except SequencesFailed as exc:  # a result, not a crash: every rank saw the same rows
            answer = StepAnswer(sampled=exc.sampled, failed=exc.failed)
        hidden = runner.take_hidden_outputs()  # every rank computed them: one rank's go back
        if answers:
            stats = runner.statistics()
            answer = StepAnswer(
                sampled=answer.sampled,
                failed=answer.failed,
                hidden=hidden,
                num_steps=stats.num_steps,
                num_overlapped=stats.num_overlapped,
                num_overlap_hits=stats.num_overlap_hits,
                num_overlap_splits=stats.num_overlap_splits,
                num_overlap_merges=stats.num_overlap_merges,
            )
            conn.send_bytes(command_encoder.encode(answer))


def worker_ready(rank: int, runner: ModelRunner) -> WorkerReady:
    return WorkerReady(
        rank=rank,
        block_size=runner.block_size,
        num_gpu_blocks=runner.num_gpu_blocks,
        num_cpu_blocks=runner.num_cpu_blocks,
        vocab_size=runner.vocab_size,
        max_model_len=runner.max_model_len,
        eos_token_ids=tuple(runner.eos_token_ids),
        num_lookahead_tokens=runner.num_lookahead_tokens,
        kv_window=runner.kv_window,
    )


def report_failure(conn: Connection, rank: int, exc: BaseException) -> None:
    """Best effort: the engine may be gone already."""
    failed = WorkerFailed(rank=rank, error_type=type(exc).__name__, message=str(exc))
    try:
        conn.send_bytes(command_encoder.encode(failed))
    except (OSError, ValueError):
        pass
