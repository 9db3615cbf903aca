"""The scheduler's EngineStats: a snapshot of the pools (as of the last AllocationResult), the
queues and the counters, sent with every TokenBatch (so once per step). The LoRA adapters in
use, named only when the engine serves adapters (max_loras > 0), are the queues' counts
(adapter_counts.py): no scan of the queues."""

from __future__ import annotations

from troupe.actors.core.scheduler_step_facts import StepFacts
from troupe.actors.core.step_planner import StepPlanner
from troupe.messages.events import EngineStats
from troupe.messages.scheduler import AllocationResult


def engine_stats(
    pools: AllocationResult,
    planner: StepPlanner,
    num_cpu_blocks: int,
    num_steps: int,
    facts: StepFacts,
) -> EngineStats:
    q, num_gpu, spec = planner.queues, planner.limits.num_gpu_blocks, planner.speculator
    max_loras = planner.limits.max_loras
    running, waiting = q.adapters.names() if max_loras else ((), ())
    return EngineStats(
        num_gpu_blocks=num_gpu,
        num_gpu_blocks_used=num_gpu - pools.num_gpu_free,
        num_gpu_blocks_cached=pools.num_gpu_cached,
        num_cpu_blocks=num_cpu_blocks,
        num_cpu_blocks_used=num_cpu_blocks - pools.num_cpu_free,
        num_running=len(q.running) + len(q.awaiting),  # awaiting a late token: seated
        num_waiting=len(q.waiting),
        num_swapped=len(q.swapped),
        num_preemptions_swap=planner.num_preemptions_swap,
        num_preemptions_recompute=planner.num_preemptions_recompute,
        prefix_cache_hit_tokens=pools.prefix_cache_hit_tokens,
        prefix_cache_query_tokens=pools.prefix_cache_query_tokens,
        prefix_cache_cpu_hit_tokens=pools.prefix_cache_cpu_hit_tokens,
        num_steps=num_steps,
        num_spec_proposed_tokens=spec.num_proposed,
        num_spec_accepted_tokens=spec.num_accepted,
        spec_accepted_lengths=tuple(spec.accepted_lengths) if spec.enabled else (),
        max_loras=max_loras,
        running_lora_adapters=running,
        waiting_lora_adapters=waiting,
        steps_by_tokens=facts.steps_by_tokens,
        num_step_tokens=facts.num_step_tokens,
    )
