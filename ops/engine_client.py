"""How an engine-mode benchmark drives its requests: one task per request, or callbacks.

    tasks      one task per request iterating `Engine.generate`: what an online app embedding
               the engine does; every step wakes each running request's task on the event
               loop the actors share (256 task steps a step at full batch)
    callbacks  `Engine.submit` with an event callback per request: what the offline batch API
               (`generate_batch`, actors/offline.py) does, as vLLM's `LLM.generate` runs
               without a task per request; no wake-ups beside the actors

Measured apart because the engine's executor thread shares the interpreter lock with that loop
(docs/benchmarks.md, session 25). Both return the output tokens each request produced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import anyio
from troupe.actors.engine import Engine
from troupe.messages import SamplingParams, StreamEvent

Client = Literal["tasks", "callbacks"]
CLIENTS: tuple[Client, ...] = ("tasks", "callbacks")


async def run_requests(
    engine: Engine,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    client: Client = "tasks",
) -> list[int]:
    """Run every (prompt, params) pair to its terminal event; output tokens per request."""
    counts = [0] * len(prompts)
    if client == "tasks":

        async def one(i: int) -> None:
            async for event in engine.generate(prompts[i], params[i]):
                counts[i] += len(event.token_ids)

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
        return counts
    all_done = anyio.Event()
    left = len(prompts)

    def collector(i: int) -> Callable[[StreamEvent], None]:
        def on_event(event: StreamEvent) -> None:
            nonlocal left
            counts[i] += len(event.token_ids)
            if event.is_terminal:
                left -= 1
                if not left:
                    all_done.set()

        return on_event

    for i in range(len(prompts)):
        await engine.submit(prompts[i], params[i], collector(i))
    if prompts:
        await all_done.wait()
    return counts
