"""The two runners of prefill/decode disaggregation, as the two executor actors see them.

The engine process holds no model: it spawns one worker process per side (gpu/pd_worker.py,
torch.multiprocessing's spawn context, daemonic) and gives each executor a PhaseRunner, a
Runner that sends its plans down that side's pipe and waits for the answer:

    prefill executor thread ─ execute ─► PhaseRunner ══ pipe ══► prefill worker (rank 0) ┐
    decode executor thread ── execute ─► PhaseRunner ══ pipe ══► decode worker (rank 1) ─┤ KV
                                          waits on its pipe and BOTH workers' sentinels   ┘ blocks

The two executors step concurrently; a side waits in a transfer for its peer, so a dead peer
must end that wait: each PhaseRunner also watches the other side's process, and any failure
stops both workers and fails every later step with the reason (as TPRunner does).
"""

from __future__ import annotations

import multiprocessing.connection
import shutil
import tempfile
import threading
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import NoReturn

import torch
import torch.multiprocessing
from troupe.child_processes import child_context
from troupe.config import ConfigError, EngineConfig
from troupe.gpu.model_config import ModelLoadError
from troupe.gpu.pd_worker import side_device, worker_main
from troupe.gpu.runner import HiddenOutputs, RunnerStats, SequencesFailed
from troupe.gpu.runner_dead import RunnerDead
from troupe.gpu.tp_protocol import (
    Close,
    Execute,
    StepAnswer,
    WorkerFailed,
    WorkerReady,
    WorkerReply,
    command_encoder,
    reply_decoder,
)
from troupe.messages import Phase, SampledToken, StepPlan, TokenMasks

STOP_GRACE_S = 10.0  # how long close() waits for the workers to exit before killing them


class DisaggregationError(RunnerDead):
    """A disaggregation worker failed or exited; the engine cannot step any more (a
    RunnerDead: the engine turns dead, gpu/runner_dead.py)."""


class WorkerPair:
    """The two side processes: start-up, one step on one side, shutdown."""

    def __init__(self, config: EngineConfig) -> None:
        for phase in Phase:
            device = side_device(config, phase)
            if device.type == "cuda" and device.index >= torch.cuda.device_count():
                name = f"{phase}_device_index"
                raise ConfigError(
                    f"{name} ({device.index}) is not a CUDA device torch sees "
                    f"({torch.cuda.device_count()})"
                )
        self.config = config
        self._dir = tempfile.mkdtemp(prefix="troupe-pd-")
        self._lock = threading.Lock()
        self._error: str | None = None
        self._closed = False
        self.conns: dict[Phase, Connection] = {}
        self.procs: dict[Phase, BaseProcess] = {}
        context = child_context()
        init_file = str(Path(self._dir) / "init")
        try:
            for phase in Phase:
                ours, theirs = context.Pipe()
                proc = context.Process(
                    target=worker_main,
                    args=(phase, config, init_file, theirs),
                    name=f"troupe-{phase}",
                    daemon=True,
                )
                proc.start()
                theirs.close()  # the worker holds the only other end: its exit is our EOF
                self.conns[phase], self.procs[phase] = ours, proc
            self.ready = {phase: self._ready(phase) for phase in Phase}
        except BaseException:
            self._stop()
            raise

    def step(self, phase: Phase, plan: StepPlan) -> StepAnswer:
        if self._error is not None:
            raise DisaggregationError(self._error)
        try:
            self.conns[phase].send_bytes(command_encoder.encode(Execute(plan)))
        except OSError:
            self._fail(self._exit_report() or f"the {phase} worker closed its pipe")
        answer = self._receive(phase)
        assert isinstance(answer, StepAnswer), answer
        return answer

    def close(self) -> None:
        """Ask both sides to stop, wait a grace period, kill what is left (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._error is None:
            for conn in self.conns.values():
                try:
                    conn.send_bytes(command_encoder.encode(Close()))
                except OSError:
                    pass
        self._stop()
        for conn in self.conns.values():
            conn.close()

    def exit_codes(self) -> dict[Phase, int | None]:
        return {phase: proc.exitcode for phase, proc in self.procs.items()}

    def _ready(self, phase: Phase) -> WorkerReady:
        reply = self._receive(phase)
        assert isinstance(reply, WorkerReady), reply
        return reply

    def _receive(self, phase: Phase) -> WorkerReply:
        """The side's next reply; its failure, or either side's exit, first raises."""
        conn = self.conns[phase]
        sentinels = {proc.sentinel: side for side, proc in self.procs.items()}
        ready = multiprocessing.connection.wait([conn, *sentinels])
        if conn in ready:  # first: a side that reported its error and exited is ready both ways
            try:
                reply = reply_decoder.decode(conn.recv_bytes())
            except (EOFError, OSError):
                self._fail(self._exit_report() or f"the {phase} worker closed its pipe")
            if isinstance(reply, WorkerFailed):
                self._fail_with(phase, reply)
            return reply
        exited = [sentinels[s] for s in ready if s in sentinels]
        self.procs[exited[0]].join(timeout=5)
        self._fail(self._exit_report() or f"the {exited[0]} worker exited")

    def _exit_report(self) -> str:
        for proc in self.procs.values():
            proc.join(timeout=0)
        return "; ".join(
            f"the {phase} worker exited with code {proc.exitcode}"
            for phase, proc in self.procs.items()
            if proc.exitcode is not None
        )

    def _fail_with(self, phase: Phase, failed: WorkerFailed) -> NoReturn:
        if failed.error_type in ("ConfigError", "ModelLoadError"):  # start-up: as themselves
            self._error = failed.message
            self._stop()
            raise (ConfigError if failed.error_type == "ConfigError" else ModelLoadError)(
                failed.message
            )
        raised = f"the {phase} worker raised {failed.error_type}: {failed.message}"
        dead = self._exit_report()
        self._fail(f"{dead}; {raised}" if dead else raised)

    def _fail(self, reason: str) -> NoReturn:
        with self._lock:
            if self._error is None:
                self._error = f"disaggregation worker failed: {reason}"
        self._stop()
        raise DisaggregationError(self._error)

    def _stop(self) -> None:
        """Join both workers (a grace period unless failed), kill the rest, drop the dir."""
        for proc in self.procs.values():
            proc.join(timeout=STOP_GRACE_S if self._error is None else 0)
        for proc in self.procs.values():
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        shutil.rmtree(self._dir, ignore_errors=True)


class PhaseRunner:
    """One side's Runner: plans down its worker's pipe (gpu/runner.py's protocol)."""

    def __init__(self, pair: WorkerPair, phase: Phase) -> None:
        self.pair = pair
        self.phase = phase
        ready = pair.ready
        self.block_size = ready[phase].block_size
        # both pools hold the blocks the allocator hands out: the smaller pool's count
        self.num_gpu_blocks = min(r.num_gpu_blocks for r in ready.values())
        self.num_cpu_blocks = 0  # preemption recomputes (each side has its own device pool)
        self.vocab_size = ready[phase].vocab_size
        self.max_model_len = min(r.max_model_len for r in ready.values())
        self.eos_token_ids = ready[phase].eos_token_ids
        self.num_lookahead_tokens = max(r.num_lookahead_tokens for r in ready.values())
        self.kv_window = 0  # sliding-window models are refused by the workers
        # CPU pools are committed as blocks are first written (gpu/kv_cache.py)
        self.kv_pages_on_write = side_device(pair.config, phase).type == "cpu"
        self.lora = None  # LoRA is refused with disaggregation (config_checks.py)
        self.max_stream_len = 0  # StreamingLLM is refused with disaggregation
        self._stats = RunnerStats()

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        answer = self.pair.step(self.phase, plan)
        self._stats = RunnerStats(
            num_steps=answer.num_steps,
            num_overlapped=answer.num_overlapped,
            num_overlap_hits=answer.num_overlap_hits,
            num_overlap_splits=answer.num_overlap_splits,
            num_overlap_merges=answer.num_overlap_merges,
            num_kv_blocks_sent=answer.num_kv_blocks_sent,
            num_kv_blocks_received=answer.num_kv_blocks_received,
        )
        if answer.failed:
            raise SequencesFailed(answer.sampled, answer.failed)
        return answer.sampled

    def launch(self, plan: StepPlan) -> None:
        raise NotImplementedError("structured output is refused with disaggregation")

    def finish(self, masks: TokenMasks) -> tuple[SampledToken, ...]:
        raise NotImplementedError("structured output is refused with disaggregation")

    def take_hidden_outputs(self) -> HiddenOutputs:
        return HiddenOutputs()  # refused with disaggregation (admission)

    def statistics(self) -> RunnerStats:
        return self._stats

    def close(self) -> None:
        self.pair.close()  # either side's close stops both


def launch_disaggregated(config: EngineConfig) -> tuple[PhaseRunner, PhaseRunner]:
    """Spawn both sides and wait until both have loaded the model: (prefill, decode)."""
    pair = WorkerPair(config)
    first, second = pair.ready.values()
    if first.vocab_size != second.vocab_size or first.block_size != second.block_size:
        pair.close()
        raise ConfigError("the prefill and decode sides loaded different models")
    return PhaseRunner(pair, Phase.PREFILL), PhaseRunner(pair, Phase.DECODE)
