"""WorkerRunner: a Runner in the engine process that drives one worker process per rank of a
torch.distributed group and holds no model itself. Tensor parallelism (gpu/tp_runner.py) and
pipeline parallelism (gpu/pp_runner.py) are two specs of it.

It spawns the workers (torch.multiprocessing's spawn context, daemonic; each runs
gpu/tp_worker.worker_main with its spec's builder), sends each command to rank 0 over a pipe
and waits for the answering rank's answer, or for any rank's failure or exit, whichever comes
first:

    executor thread ─ execute(plan) ─► WorkerRunner ══ pipe ══► rank 0 ══ gloo broadcast ══► 1..
                    ◄── tokens ──────              ◄══ answer ══ the answering rank
                                      waits on: every rank's pipe + every rank's process sentinel

It never joins a collective itself, so a dead or failing rank cannot hang it: the step raises
the spec's RunnerDead subclass naming the rank, every worker is stopped, and the engine turns
dead: every open request fails with that message, new ones are refused (gpu/runner_dead.py).
Workers are daemonic and rank 0 stops the group when the engine's end of its pipe closes, so
none outlives the engine.
"""

from __future__ import annotations

import dataclasses
import multiprocessing.connection
import shutil
import tempfile
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from troupe.child_processes import child_context
from troupe.config import ConfigError, EngineConfig
from troupe.gpu.model_config import ModelLoadError
from troupe.gpu.runner import HiddenOutputs, RunnerStats, SequencesFailed
from troupe.gpu.runner_dead import RunnerDead
from troupe.gpu.tp_protocol import (
    Close,
    Execute,
    Finish,
    Launch,
    LoadLora,
    LoraAnswer,
    StepAnswer,
    UnloadLora,
    WorkerCommand,
    WorkerFailed,
    WorkerReady,
    WorkerReply,
    command_encoder,
    reply_decoder,
)
from troupe.gpu.tp_worker import worker_main
from troupe.messages import SampledToken, StepPlan, TokenMasks

if TYPE_CHECKING:
    from troupe.gpu.lora_runtime import AdapterStore
    from troupe.gpu.model_runner import ModelRunner
    from troupe.gpu.tp_group import TPGroup

STOP_GRACE_S = 10.0  # how long close() waits for the workers to exit before killing them


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """What kind of group a WorkerRunner drives."""

    size: int  # worker processes (ranks)
    # builds a rank's ModelRunner in its process: a module-level function (spawn pickles it)
    build: Callable[[EngineConfig, TPGroup], ModelRunner]
    answer_rank: int = 0  # the rank whose pipe answers each step
    failure: str  # the error's opening: "tensor-parallel worker failed"
    unit: str = "rank"  # how the messages name a worker: "rank 1", "stage 1"
    error: type[RunnerDead] = RunnerDead  # what a failed or exited worker raises
    process_name: str = "troupe-worker"  # process names: f"{process_name}{rank}"


class WorkerRunner:
    """Drives spec.size worker processes; see the module docstring."""

    def __init__(self, config: EngineConfig, spec: WorkerSpec) -> None:
        self._spec = spec
        self._dir = tempfile.mkdtemp(prefix="troupe-workers-")
        self._error: str | None = None
        self._stats = RunnerStats()
        self._hidden = HiddenOutputs()  # the answering rank's, not yet taken
        self._conns: list[Connection] = []
        self._round_trip = threading.Lock()  # steps (executor thread), LoRA loads (another)
        self._procs: list[BaseProcess] = []
        context = child_context()
        init_file = str(Path(self._dir) / "init")
        size = spec.size
        try:
            for rank in range(size):
                ours, theirs = context.Pipe()
                proc = context.Process(
                    target=worker_main,
                    args=(rank, config, size, init_file, theirs, spec.build, spec.answer_rank),
                    name=f"{spec.process_name}{rank}",
                    daemon=True,  # multiprocessing stops them if this process exits
                )
                proc.start()
                theirs.close()  # the worker holds the only other end: its exit is our EOF
                self._conns.append(ours)
                self._procs.append(proc)
            replies = self._receive(set(range(size)))
        except BaseException:
            self._stop()
            raise
        ready = [replies[rank] for rank in range(size)]
        first = ready[0]
        assert isinstance(first, WorkerReady)
        for other in ready[1:]:
            assert isinstance(other, WorkerReady)
            if other.num_gpu_blocks != first.num_gpu_blocks or other.vocab_size != first.vocab_size:
                self._fail(
                    f"{spec.unit} {other.rank} disagrees with {spec.unit} 0 on its pools or "
                    "vocabulary"
                )
        self.block_size = first.block_size
        self.num_gpu_blocks = first.num_gpu_blocks
        self.num_cpu_blocks = first.num_cpu_blocks
        self.vocab_size = first.vocab_size
        self.max_model_len = first.max_model_len
        self.eos_token_ids = first.eos_token_ids
        self.num_lookahead_tokens = first.num_lookahead_tokens
        self.kv_pages_on_write = False  # CUDA pools: committed when allocated
        # the workers hold any adapters (gpu/tp_lora.py); a spec that loads them at run time
        # sets a client of lora_command (gpu/tp_lora_runtime.py)
        self.lora: AdapterStore | None = None
        # the widest window when every layer of every rank has one, else 0 (pipeline stages
        # hold different layers: one stage of only windowed layers must not free a block that
        # another stage's full-attention layer still reads)
        windows = [r.kv_window for r in ready if isinstance(r, WorkerReady)]
        self.kv_window = 0 if 0 in windows else max(windows)
        self.max_stream_len = 0  # no streaming attention across processes (not built)

    # -- the Runner protocol -------------------------------------------------------------------

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        return self._step(Execute(plan))

    def launch(self, plan: StepPlan) -> None:
        self._step(Launch(plan))

    def finish(self, masks: TokenMasks) -> tuple[SampledToken, ...]:
        return self._step(Finish(masks))

    def take_hidden_outputs(self) -> HiddenOutputs:
        hidden, self._hidden = self._hidden, HiddenOutputs()
        return hidden

    def statistics(self) -> RunnerStats:
        """The answering rank's counts as of its last answer (no round trip: any thread)."""
        return self._stats

    def close(self) -> None:
        """Ask the ranks to stop, wait a grace period, kill what is left."""
        if self._error is None and self._conns:
            try:
                self._conns[0].send_bytes(command_encoder.encode(Close()))
            except OSError:
                pass
        self._stop()

    # -- diagnostics and fault injection (tests) -----------------------------------------------

    def worker_exit_codes(self) -> tuple[int | None, ...]:
        """Each rank's exit code, None while it runs."""
        return tuple(proc.exitcode for proc in self._procs)

    def worker_pids(self) -> tuple[int, ...]:
        return tuple(proc.pid or 0 for proc in self._procs)

    def kill_worker(self, rank: int) -> None:
        """SIGKILL one rank and wait until it is gone (a crash, for tests)."""
        self._procs[rank].kill()
        self._procs[rank].join()

    # -- internals -----------------------------------------------------------------------------

    def lora_command(self, command: LoadLora | UnloadLora) -> LoraAnswer:
        """Every worker runs a LoRA load or unload between steps; the answering rank's reply."""
        answer = self._round_trip_to(command)
        assert isinstance(answer, LoraAnswer)
        return answer

    def _round_trip_to(self, command: WorkerCommand) -> WorkerReply:
        with self._round_trip:
            if self._error is not None:
                raise self._spec.error(self._error)
            try:
                self._conns[0].send_bytes(command_encoder.encode(command))
            except OSError:
                self._fail(self._exit_report() or f"{self._spec.unit} 0 closed its pipe")
            answering = self._spec.answer_rank
            return self._receive({answering})[answering]

    def _step(self, command: WorkerCommand) -> tuple[SampledToken, ...]:
        answer = self._round_trip_to(command)
        assert isinstance(answer, StepAnswer)
        self._stats = RunnerStats(
            num_steps=answer.num_steps,
            num_overlapped=answer.num_overlapped,
            num_overlap_hits=answer.num_overlap_hits,
            num_overlap_splits=answer.num_overlap_splits,
            num_overlap_merges=answer.num_overlap_merges,
        )
        self._hidden = HiddenOutputs(
            prompt_logprobs=self._hidden.prompt_logprobs + answer.hidden.prompt_logprobs,
            embeddings=self._hidden.embeddings + answer.hidden.embeddings,
        )
        if answer.failed:
            raise SequencesFailed(answer.sampled, answer.failed)
        return answer.sampled

    def _receive(self, ranks: set[int]) -> dict[int, WorkerReply]:
        """One reply from each of `ranks`; any rank's failure or exit first raises."""
        unit = self._spec.unit
        pending, replies = set(ranks), dict[int, WorkerReply]()
        sentinels = {proc.sentinel: rank for rank, proc in enumerate(self._procs)}
        while pending:
            ready = multiprocessing.connection.wait([*self._conns, *sentinels])
            # pipes first: a rank that reported its error and exited is ready both ways
            for rank, conn in enumerate(self._conns):
                if conn not in ready:
                    continue
                try:
                    reply = reply_decoder.decode(conn.recv_bytes())
                except (EOFError, OSError):
                    self._fail(self._exit_report() or f"{unit} {rank} closed its pipe")
                if isinstance(reply, WorkerFailed):
                    self._fail_with(reply)
                if rank not in pending:
                    self._fail(f"{unit} {rank} answered out of turn ({type(reply).__name__})")
                replies[rank] = reply
                pending.discard(rank)
            exited = [rank for s, rank in sentinels.items() if s in ready]
            if exited and pending:
                for rank in exited:  # its sentinel fired: it is gone, join only reaps it
                    self._procs[rank].join(timeout=5)
                self._fail(self._exit_report() or f"{unit} {exited[0]} exited")
        return replies

    def _exit_report(self) -> str:
        for proc in self._procs:
            proc.join(timeout=0)
        dead = [
            f"{self._spec.unit} {rank} exited with code {proc.exitcode}"
            for rank, proc in enumerate(self._procs)
            if proc.exitcode is not None
        ]
        return "; ".join(dead)

    def _fail_with(self, failed: WorkerFailed) -> NoReturn:
        if failed.error_type in ("ConfigError", "ModelLoadError"):  # start-up: as themselves
            self._error = failed.message
            self._stop()
            error = ConfigError if failed.error_type == "ConfigError" else ModelLoadError
            raise error(failed.message)
        # a rank that died first is the cause (the others' collectives then fail): name it
        raised = f"{self._spec.unit} {failed.rank} raised {failed.error_type}: {failed.message}"
        dead = self._exit_report()
        self._fail(f"{dead}; {raised}" if dead else raised)

    def _fail(self, reason: str) -> NoReturn:
        self._error = f"{self._spec.failure}: {reason}"
        self._stop()
        raise self._spec.error(self._error)

    def _stop(self) -> None:
        """Join every worker (a grace period), kill the rest, drop the init directory."""
        for proc in self._procs:
            proc.join(timeout=STOP_GRACE_S if self._error is None else 0)
        for proc in self._procs:
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._conns = []
        shutil.rmtree(self._dir, ignore_errors=True)
