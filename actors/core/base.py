"""What every actor core is: a synchronous function of its inbox batches.

The async shell (actors/shell.py) receives a batch, calls `handle`, and sends what it returns;
trace replay (ops/replay.py) calls `handle` with recorded batches and compares the outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, TypeVar, get_args

import msgspec

# (outbox name, message): the outbox is named after the actor that receives it.
Outgoing = list[tuple[str, msgspec.Struct]]

InboxT = TypeVar("InboxT", contravariant=True)

# Every inbox of the graph; "client" is the engine's router (StreamBatches for the callers),
# "engine" its calls' replies (actors/engine_admin.py).
ActorName = Literal[
    "tokenizer",
    "admission",
    "scheduler",
    "allocator",
    "grammar",
    "executor",
    "streamer",
    "client",
    "engine",
    "phase_router",  # prefill/decode disaggregation: "executor" is then the decode side
    "prefill_executor",
]
ACTOR_NAMES: tuple[ActorName, ...] = get_args(ActorName)


class Core(Protocol[InboxT]):
    """A deterministic state machine: same inbox batches in, same messages out."""

    def handle(self, batch: Sequence[InboxT]) -> Outgoing: ...
