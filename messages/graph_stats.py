"""How the actor graph is doing now: per actor, the messages it took and sent, and its inbox.

Counted by the actor shell (actors/shell.py), the single place every message passes through;
read on demand (`Engine.graph_stats()`, the gateway's live view), never pushed per step.
Counts are totals since the engine started: a reader turns two snapshots into rates.
"""

from __future__ import annotations

import msgspec


class ChannelCount(msgspec.Struct, frozen=True, kw_only=True):
    """Messages one actor has sent to one receiver."""

    receiver: str
    num_messages: int


class ActorStats(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    num_received: int  # messages taken from its inbox
    num_batches: int  # handle() calls (a batch drains what waits, up to max_batch)
    busy_seconds: float  # inside handle()
    inbox_depth: int  # messages waiting in its inbox now
    inbox_buffer: int | None  # the inbox's capacity; None: unbounded (on a cycle)
    num_blocked_senders: int  # senders waiting for room in its inbox now (backpressure)
    sent: tuple[ChannelCount, ...]  # one per receiver it may send to


class GraphStats(msgspec.Struct, frozen=True, kw_only=True):
    """Every actor's counts, and the engine's own inbox (StreamBatches for its router)."""

    actors: tuple[ActorStats, ...] = ()
    client_inbox_depth: int = 0
    client_inbox_buffer: int = 0
    time: float = 0.0  # time.monotonic() when taken (CLOCK_MONOTONIC: one clock per machine)
