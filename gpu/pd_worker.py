"""One side of prefill/decode disaggregation: its own process (spawned by gpu/pd_runner.py),
a whole model, a KV pool of the shared geometry, and its end of the pair's process group.

    engine process ── Execute(plan) ──► this worker: KV transfers of the plan (gpu/kv_transfer.py),
                   ◄── StepAnswer ────               then ModelRunner.execute(plan)

The pair's group has two ranks (prefill 0, decode 1): gloo on the CPU, NCCL on CUDA, where
each side runs on its own device (EngineConfig.prefill_device_index / decode_device_index).
A worker that raises reports WorkerFailed on its pipe and exits; the engine then stops the
pair. A worker that reads the end of its pipe (the engine died) exits.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist
from troupe.config import ConfigError, EngineConfig
from troupe.gpu.kv_transfer import PEER_RANK, RANK, KVTransfer
from troupe.gpu.model_runner import ModelRunner
from troupe.gpu.runner import SequencesFailed
from troupe.gpu.runner_setup import uses_cuda
from troupe.gpu.tp_protocol import (
    Close,
    Execute,
    StepAnswer,
    command_decoder,
    command_encoder,
)
from troupe.gpu.tp_worker import report_failure, worker_ready
from troupe.messages import Phase


def side_device(config: EngineConfig, phase: Phase) -> torch.device:
    """The side's CUDA device (its index from the config), else the CPU."""
    if uses_cuda(config):
        index = (
            config.prefill_device_index if phase == Phase.PREFILL else config.decode_device_index
        )
        return torch.device("cuda", index)
    return torch.device("cpu")


def side_config(config: EngineConfig, phase: Phase, device: torch.device) -> EngineConfig:
    """The config one side's runner is built from: no swap pool (preemption recomputes), and
    no overlapped decode on the prefill side (its requests leave after their first token)."""
    return config.replace(
        device=device.type,
        num_cpu_blocks=0,
        enable_overlap_schedule=config.enable_overlap_schedule and phase == Phase.DECODE,
    )


def worker_main(phase: Phase, config: EngineConfig, init_file: str, conn: Connection) -> None:
    """The process body of one side (a spawn target: importable, picklable arguments)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine decides when the pair stops
    runner: ModelRunner | None = None
    exit_code = 0
    clean = False  # left the group's last transfer with the peer: tear the group down
    try:
        device = side_device(config, phase)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:  # the two sides share the host's cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"file://{init_file}",
            rank=RANK[phase],
            world_size=2,
            timeout=timedelta(hours=1),  # a dead peer is found by the engine's sentinels
        )
        _handshake(phase, device)
        runner = ModelRunner.from_config(side_config(config, phase, device))
        if runner.kv_window:
            raise ConfigError(
                f"disaggregation {config.disaggregation!r} does not support models whose every "
                f"layer has a sliding window (kv_window {runner.kv_window}): blocks behind the "
                "window are released while their ids stay in the tables"
            )
        conn.send_bytes(command_encoder.encode(worker_ready(RANK[phase], runner)))
        transfer = KVTransfer(runner.kv, phase)
        clean = _serve(runner, transfer, conn) and transfer.flush()
        if clean:
            dist.barrier()  # both sides are out of their last transfer before either tears down
    except BaseException as exc:  # reported to the engine, then this side exits
        if not isinstance(exc, ConfigError):
            traceback.print_exc()
        report_failure(conn, RANK[phase], exc)
        exit_code = 1
    finally:
        if runner is not None:
            runner.close()
        if exit_code == 0 and clean and dist.is_initialized():
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)  # as tp_worker: no teardown racing the peer's communication threads


def _handshake(phase: Phase, device: torch.device) -> None:
    """One small prefill -> decode message: the link works (and NCCL's pair is made now)."""
    probe = torch.ones(1, device=device)
    if phase == Phase.PREFILL:
        dist.send(probe, dst=PEER_RANK[phase])
    else:
        dist.recv(probe, src=PEER_RANK[phase])


def _serve(runner: ModelRunner, transfer: KVTransfer, conn: Connection) -> bool:
    """Run plans until Close (True) or the end of the engine's pipe (False: the engine process
    is gone, and maybe the peer too)."""
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return False
        command = command_decoder.decode(data)
        if isinstance(command, Close):
            return True
        if not isinstance(command, Execute):
            raise TypeError(f"disaggregation runs plans only, got {type(command).__name__}")
        transfer.apply(command.plan)
        try:
            answer = StepAnswer(sampled=runner.execute(command.plan))
        except SequencesFailed as exc:  # a result: the others' tokens are good
            answer = StepAnswer(sampled=exc.sampled, failed=exc.failed)
        stats = runner.statistics()
        conn.send_bytes(
            command_encoder.encode(
                StepAnswer(
                    sampled=answer.sampled,
                    failed=answer.failed,
                    num_steps=stats.num_steps,
                    num_overlapped=stats.num_overlapped,
                    num_overlap_hits=stats.num_overlap_hits,
                    num_overlap_splits=stats.num_overlap_splits,
                    num_overlap_merges=stats.num_overlap_merges,
                    num_kv_blocks_sent=transfer.num_sent,
                    num_kv_blocks_received=transfer.num_received,
                )
            )
        )
