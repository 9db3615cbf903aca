"""The actor graph as one typed table, and the channels it is wired with.

Every actor is one `ActorSpec` row: its name, the factory of its core (actors/graph.py), the
actors it sends to, its inbox buffer and whether its core runs in a thread of its own. `wire`
builds the cores, creates one inbox per receiver (an anyio stream, or a ThreadInbox for a
thread actor: thread_inbox.py), gives each sender its own clone, and returns the actors
(downstream first: the order to start them in).

Inbox buffers: the client edge (tokenizer) is bounded, so callers feel backpressure, but roomy
(TOKENIZER_BUFFER): a sender that finds it full waits in a worker thread, a hop that a burst of
hundreds of requests pays per request before the first of them is planned. Admission
and the scheduler sit on cycles (streamer -> admission -> streamer; streamer -> scheduler ->
streamer; the executor and allocator answer the scheduler), so they are unbounded; admission's
limits bound what is in flight instead. The streamer and client inboxes hold a few batches so
the scheduler can start the next step while text is being detokenized. The executor's is
unbounded too: it holds at most the scheduler's one plan in flight and that plan's masks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream
from troupe.actors.core.base import ActorName, Core
from troupe.actors.graph import (
    GraphInputs,
    build_admission,
    build_allocator,
    build_executor,
    build_grammar,
    build_phase_router,
    build_prefill_executor,
    build_scheduler,
    build_streamer,
    build_tokenizer,
)
from troupe.actors.shell import Actor, Inbox, Outbox
from troupe.actors.thread_inbox import ThreadInbox
from troupe.messages.trace import TraceWriter

TOKENIZER_BUFFER = 1024  # requests a burst may hand the client edge before senders wait


@dataclass(frozen=True, slots=True)
class ActorSpec:
    name: ActorName
    build: Callable[[GraphInputs], Core[Any]]  # its core
    sends_to: tuple[ActorName, ...]
    inbox_buffer: float  # math.inf: unbounded (only on a documented cycle)
    in_thread: bool  # the core blocks (tokenizing, GPU work): a thread of its own
    max_batch: int = 256  # messages drained from the inbox into one handle() call
    # (outbox, receiving actor) for outboxes not named after their receiver: with
    # disaggregation the scheduler's "executor" outbox feeds the phase router
    routes: tuple[tuple[ActorName, ActorName], ...] = ()


def graph_specs(*, executor_in_thread: bool, disaggregated: bool = False) -> tuple[ActorSpec, ...]:
    """The graph, downstream first. The executor runs in a thread when its runner blocks."""
    if disaggregated:
        return disaggregated_specs()
    inf = math.inf
    return (  # name, core factory, sends to, inbox buffer, in a thread
        ActorSpec("streamer", build_streamer, ("client", "scheduler", "admission"), 8, False),
        ActorSpec(
            "executor",
            build_executor,
            ("grammar", "scheduler"),
            inf,
            executor_in_thread,
            max_batch=1,
        ),
        # grammar: per masked step, the executor's GrammarTokens, then the scheduler's
        # ComputeMasks for the next (sent only after that step's result), so at most two wait:
        # the scheduler never blocks on a grammar still filling the masks ahead. No deadlock on
        # the executor <-> grammar cycle: TokenMasks N+1 follows GrammarTokens N in time
        ActorSpec("grammar", build_grammar, ("executor",), 2, True),
        ActorSpec(
            "scheduler",
            build_scheduler,
            ("allocator", "grammar", "executor", "streamer", "engine"),
            inf,
            False,
        ),
        ActorSpec("allocator", build_allocator, ("scheduler",), 0, False),
        ActorSpec("admission", build_admission, ("scheduler", "streamer"), inf, False),
        ActorSpec("tokenizer", build_tokenizer, ("admission", "streamer"), TOKENIZER_BUFFER, True),
    )


def disaggregated_specs() -> tuple[ActorSpec, ...]:
    """Prefill/decode disaggregation: the phase router between the scheduler and two
    executors ("executor" is the decode side). The router sits on the scheduler's cycle:
    unbounded like the scheduler's inbox (a plan, a decode answer, prefill answers)."""
    inf = math.inf
    to_router: tuple[tuple[ActorName, ActorName], ...] = (("executor", "phase_router"),)
    return (
        ActorSpec("streamer", build_streamer, ("client", "scheduler", "admission"), 8, False),
        ActorSpec("executor", build_executor, ("grammar", "phase_router"), inf, True, max_batch=1),
        ActorSpec(  # unbounded: the router queues prompt chunks the prefill side has not
            "prefill_executor",  # reached yet instead of waiting (step_join.py); at most the
            build_prefill_executor,  # chunks of the admitted prompts
            ("grammar", "phase_router"),
            inf,
            True,
            max_batch=1,
        ),
        ActorSpec(  # masks are never asked for (structured output is refused), but wired
            "grammar", build_grammar, ("executor",), 2, True
        ),
        ActorSpec(
            "phase_router",
            build_phase_router,
            ("prefill_executor", "executor", "scheduler"),
            inf,
            False,
        ),
        ActorSpec(
            "scheduler",
            build_scheduler,
            ("allocator", "grammar", "executor", "streamer", "engine"),
            inf,
            False,
            routes=to_router,
        ),
        ActorSpec("allocator", build_allocator, ("scheduler",), 0, False),
        ActorSpec("admission", build_admission, ("scheduler", "streamer"), inf, False),
        ActorSpec("tokenizer", build_tokenizer, ("admission", "streamer"), TOKENIZER_BUFFER, True),
    )


CLIENT_BUFFER = 8  # StreamBatches the engine's router may fall behind by


@dataclass(frozen=True, slots=True)
class WiredGraph:
    actors: tuple[Actor, ...]  # downstream first
    to_tokenizer: Outbox  # the client edge: the engine's own sender
    to_scheduler: Outbox  # the engine's calls beside requests (messages/engine_calls.py)
    calls_inbox: MemoryObjectReceiveStream[Any]  # ... and their replies
    client_inbox: MemoryObjectReceiveStream[Any]  # StreamBatches for the engine's router


def wire(
    specs: tuple[ActorSpec, ...], inputs: GraphInputs, tracer: TraceWriter | None = None
) -> WiredGraph:
    """Cores, channels and actors for `specs`."""
    senders: dict[ActorName, Outbox] = {}
    receivers: dict[ActorName, Inbox] = {}
    for spec in specs:
        if spec.in_thread:
            inbox = ThreadInbox(spec.inbox_buffer, batches=spec.max_batch > 1)
            receivers[spec.name] = inbox
            senders[spec.name] = inbox.sender()
        else:
            senders[spec.name], receivers[spec.name] = anyio.create_memory_object_stream[Any](
                spec.inbox_buffer
            )
    senders["client"], client_inbox = anyio.create_memory_object_stream[Any](CLIENT_BUFFER)
    # unbounded: a reply per call, and the engine has few in flight (one weight update)
    senders["engine"], calls_inbox = anyio.create_memory_object_stream[Any](math.inf)
    actors = tuple(
        Actor(
            spec.name,
            spec.build(inputs),
            receivers[spec.name],
            {dest: senders[dict(spec.routes).get(dest, dest)].clone() for dest in spec.sends_to},
            max_batch=spec.max_batch,
            tracer=tracer,
        )
        for spec in specs
    )
    to_scheduler = senders["scheduler"].clone()
    for name, sender in senders.items():
        if name != "tokenizer":
            sender.close()  # only the clones held by actors keep these inboxes open
    return WiredGraph(actors, senders["tokenizer"], to_scheduler, calls_inbox, client_inbox)
