"""Run-time LoRA loads under tensor parallelism: the engine's adds and retires
(actors/lora_registry.py) travel to every rank as commands on the TP control path.

    registry ─ add(name, path) ─► TPLoraClient ══ LoadLora ══► rank 0 ══ broadcast ══► rank 1..
             (a worker thread)                                  │ every rank: LoraRuntime.add
                                                                │ (reads, checks against the
                                                                │ whole model, keeps its cut:
                                                                │ TPLoraSharding)
                                                                ▼ min over ranks: all ok?
             ◄── ok, or the first failing rank's error ══ LoraAnswer (rank 0)

A load that fails on any rank is retired on the ranks where it succeeded before the answer,
so no rank holds an adapter the others lack; the error names the rank and keeps its class
(ConfigError: the adapter does not fit the model, as on one process). An unload retires the
name on every rank. The client sends between steps (WorkerRunner holds one lock per round
trip), so a rank never sees a command inside a step's collectives.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from troupe.config import ConfigError
from troupe.gpu.lora_runtime import LoraRuntime
from troupe.gpu.tp_group import TPGroup
from troupe.gpu.tp_protocol import LoadLora, LoraAnswer, UnloadLora

_answer_encoder = msgspec.msgpack.Encoder()
_answer_decoder = msgspec.msgpack.Decoder(LoraAnswer)


def run_lora_command(
    lora: LoraRuntime | None, group: TPGroup, command: LoadLora | UnloadLora
) -> LoraAnswer:
    """Run `command` on this rank, then agree with the others (collectives on the control
    group: every rank calls this for the same command); the same answer on every rank."""
    error: LoraAnswer | None = None
    try:
        if lora is None:
            raise ConfigError("this tensor-parallel rank serves no LoRA adapters")
        if isinstance(command, LoadLora):
            lora.add(command.name, command.path)
        else:
            lora.retire(command.name)
    except Exception as exc:  # reported by name to the engine; the rank keeps serving
        error = LoraAnswer(rank=group.rank, error_type=type(exc).__name__, message=str(exc))
    first_bad = group.min_int(group.world_size if error is None else group.rank)
    if first_bad == group.world_size:
        return LoraAnswer()
    if isinstance(command, LoadLora) and error is None and lora is not None:
        lora.retire(command.name)  # another rank failed: nothing half-installed
    data = _answer_encoder.encode(error) if group.rank == first_bad else None
    return _answer_decoder.decode(group.broadcast_bytes(data, src=first_bad))


class TPLoraClient:
    """The engine process's side (an AdapterStore, gpu/lora_runtime.py): each add or retire
    is one command to the ranks, through `send` (WorkerRunner.lora_command)."""

    def __init__(self, send: Callable[[LoadLora | UnloadLora], LoraAnswer]) -> None:
        self._send = send

    def add(self, name: str, path: str) -> None:
        """Every rank reads and holds its cut of the adapter at `path` (blocks: a worker
        thread); ConfigError when it does not fit the model, RuntimeError for other failures."""
        self._raise(self._send(LoadLora(name, path)))

    def retire(self, name: str) -> None:
        """Every rank forgets the adapter."""
        self._raise(self._send(UnloadLora(name)))

    @staticmethod
    def _raise(answer: LoraAnswer) -> None:
        if not answer.error_type:
            return
        if answer.error_type == "ConfigError":
            raise ConfigError(answer.message)  # the adapter: every rank checks the same
        raise RuntimeError(
            f"tensor-parallel rank {answer.rank} raised {answer.error_type}: {answer.message}"
        )
