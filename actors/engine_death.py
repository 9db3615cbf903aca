"""A stopped engine's failure: the one message that names why, and the pools declared gone.

When the graph stops by itself (an actor raised, the executor hung past step_timeout_s, or the
runner can never step again: gpu/runner_dead.RunnerDead, vLLM's EngineDeadError) the engine
is dead. One message says why, everywhere: each open request's Failed event, each new request's
Rejected (HTTP 503), `/health`'s body, EngineStopped from `aclose()` and the engine child's
Stopped frame. A dead runner reads "engine dead: <cause>"; anything else "engine failure:
<type>: <cause>".

KV blocks: the graph's allocator and the runner's pools are gone with it (the runner is
closed), so no block is held by anyone and none can be: `pools_gone` is the last stats
snapshot with the pools and queues at zero (its counters keep their totals), what `stats()`
and /metrics show from then on.
"""

from __future__ import annotations

import msgspec
from troupe.gpu.runner_dead import RunnerDead
from troupe.messages import EngineStats


def stop_cause(exc: BaseException) -> BaseException:
    """What stopped the graph, out of the task group's exception: a RunnerDead wherever it
    is (the siblings it broke raise too), else the group's single leaf, else the group."""
    leaves = _leaves(exc)
    dead = [leaf for leaf in leaves if isinstance(leaf, RunnerDead)]
    if dead:
        return dead[0]
    return leaves[0] if len(leaves) == 1 else exc


def failure_message(cause: BaseException) -> str:
    """The message every request of the stopped engine gets."""
    if isinstance(cause, RunnerDead):
        return f"engine dead: {cause}"
    return f"engine failure: {type(cause).__name__}: {cause}"


def pools_gone(stats: EngineStats) -> EngineStats:
    """`stats` once the engine is dead: no pool, no block used, no request queued or running."""
    return msgspec.structs.replace(
        stats,
        num_gpu_blocks=0,
        num_gpu_blocks_used=0,
        num_gpu_blocks_cached=0,
        num_cpu_blocks=0,
        num_cpu_blocks_used=0,
        num_running=0,
        num_waiting=0,
        num_swapped=0,
        running_lora_adapters=(),
        waiting_lora_adapters=(),
    )


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]
