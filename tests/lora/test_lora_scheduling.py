"""LoRA in the scheduler and the allocator (CPU, fake runner): the prefix cache keeps each cache
namespace (adapter, cache_salt) apart, and at most max_loras adapters run in a step.

Namespaces: a prompt's KV computed through adapter a must never serve the base model or adapter
b, nor KV under one salt another salt's request; within one namespace hits still happen. The
allocator is asserted on its grants (num_cached_tokens, the blocks), the scheduler on its ops
and the requests' counts. max_loras: every StepPlan's requests span at most max_loras adapters,
base requests run beside them, and every request finishes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import anyio
import pytest
from troupe import Engine, EngineConfig, SamplingParams
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.prefix_cache import MAX_NAMESPACES, ROOT_SERIAL, PrefixCache
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.graph import GraphInputs, build_scheduler
from troupe.messages import (
    AdmittedRequest,
    Finished,
    FinishReason,
    StepPlan,
    StepResult,
    StreamEvent,
)
from troupe.messages.allocator import (
    AllocateBatch,
    AllocateNew,
    AllocOp,
    CacheBlocks,
    Fork,
    FreeRequest,
)
from troupe.messages.scheduler import AllocationResult, Grant
from troupe.messages.trace import RunnerNumbers, read_trace
from troupe.ops.replay import replay_trace

from tests.actors.core.allocator_invariants import check_allocator
from tests.actors.core.test_scheduler import BS, Rig, prompt
from tests.graph_helpers import collect, terminal

BASE = SamplingParams().cache_namespace
NS_A = SamplingParams(lora="a").cache_namespace
NS_B = SamplingParams(lora="b").cache_namespace
NS_SALT = SamplingParams(cache_salt="x").cache_namespace
NS_A_SALT = SamplingParams(lora="a", cache_salt="x").cache_namespace
PROMPT = prompt(9)  # two full blocks and one token: a hit covers at most 8


def apply(alloc: AllocatorCore, *ops: AllocOp) -> AllocationResult:
    result = alloc.apply(AllocateBatch(step_id=1, ops=ops))
    check_allocator(alloc)
    return result


def grant(
    alloc: AllocatorCore, rid: str, namespace: str, tokens: tuple[int, ...] = PROMPT
) -> Grant:
    """The grant of a new request (all its tokens computed at once)."""
    result = apply(alloc, AllocateNew(rid, tokens, len(tokens), namespace=namespace))
    (got,) = result.grants
    return got


# -- the prefix cache keeps namespaces apart ---------------------------------------------------


def test_each_namespace_hits_only_its_own_prefix_entries() -> None:
    namespaces = {"base": BASE, "a": NS_A, "b": NS_B, "salt": NS_SALT, "a+salt": NS_A_SALT}
    assert len(set(namespaces.values())) == 5
    alloc = AllocatorCore(block_size=BS, num_gpu_blocks=64, num_cpu_blocks=0)
    computed: dict[str, tuple[int, ...]] = {}
    for name, namespace in namespaces.items():  # the same prompt, computed in each namespace
        first = grant(alloc, f"{name}-1", namespace)
        assert first.num_cached_tokens == 0, f"{name} was served another namespace's KV"
        apply(alloc, CacheBlocks(f"{name}-1", PROMPT[:8]))
        computed[name] = first.block_ids[:2]
    for name, namespace in namespaces.items():  # a second request of each hits its own
        second = grant(alloc, f"{name}-2", namespace)
        assert second.num_cached_tokens == 8, name
        assert second.block_ids[:2] == computed[name], name
    assert alloc.prefix_cache_hit_tokens == 5 * 8


def test_the_cpu_tier_brings_an_adapters_blocks_back_to_its_namespace_only() -> None:
    alloc = AllocatorCore(block_size=BS, num_gpu_blocks=4, num_cpu_blocks=8, cpu_prefix_tier=True)
    grant(alloc, "a1", NS_A)
    apply(alloc, CacheBlocks("a1", PROMPT[:8]), FreeRequest("a1"))
    evicting = apply(alloc, AllocateNew("other", prompt(16, 300), 16), FreeRequest("other"))
    assert len(evicting.swap_out) == 2  # a1's two cached blocks went to the CPU tier
    for rid, namespace in (("base", BASE), ("b", NS_B), ("a-salted", NS_A_SALT)):
        assert grant(alloc, rid, namespace).num_cached_tokens == 0, rid
        apply(alloc, FreeRequest(rid))
    back = apply(alloc, AllocateNew("a2", PROMPT, 9, namespace=NS_A))
    assert back.grants[0].num_cached_tokens == 8 and len(back.swap_in) == 2
    assert back.prefix_cache_cpu_hit_tokens == 8


def test_parallel_samples_register_their_blocks_in_the_parents_namespace() -> None:
    alloc = AllocatorCore(block_size=BS, num_gpu_blocks=32, num_cpu_blocks=0)
    tokens = prompt(10)
    apply(alloc, AllocateNew("p", tokens, 9, namespace=NS_A))  # a parent stops a token short
    apply(alloc, CacheBlocks("p", tokens[:8]), Fork("p", ("p0", "p1"), 9, 11))
    sample0 = (*tokens, 7, 8)  # its last prompt token computed, then one sampled token
    apply(alloc, CacheBlocks("p0", sample0[8:12]))  # a sample's own block, chained on
    later = (*sample0, 9)
    assert grant(alloc, "base", BASE, later).num_cached_tokens == 0
    assert grant(alloc, "b", NS_B, later).num_cached_tokens == 0
    assert grant(alloc, "a", NS_A, later).num_cached_tokens == 12


def test_namespace_roots_are_serials_no_entry_has() -> None:
    cache = PrefixCache()
    s0 = cache.register(0, ROOT_SERIAL, (1, 2))
    root_a = cache.root(NS_A)
    s1 = cache.register(1, root_a, (1, 2))
    assert cache.root(BASE) == ROOT_SERIAL and cache.root(NS_A) == root_a
    assert len({ROOT_SERIAL, s0, root_a, s1}) == 4
    assert cache.lookup(ROOT_SERIAL, (1, 2)) == 0 and cache.lookup(root_a, (1, 2)) == 1
    assert cache.lookup(cache.root(NS_B), (1, 2)) is None


def test_namespace_roots_are_bounded_forgetting_the_least_recently_used() -> None:
    cache = PrefixCache(max_namespaces=2)
    root_a, root_b = cache.root("a"), cache.root("b")
    assert cache.root("a") == root_a  # used again: b is now the oldest
    root_c = cache.root("c")  # forgets b
    assert cache.num_namespaces == 2
    assert cache.root("a") == root_a and cache.root("c") == root_c
    assert cache.root("b") not in {root_a, root_b, root_c}  # a fresh root: b's chains are lost
    assert cache.num_namespaces == 2
    assert cache.root("") == ROOT_SERIAL and cache.num_namespaces == 2  # the base takes none


def test_unique_salts_cannot_grow_the_roots_past_the_bound() -> None:
    cache = PrefixCache()
    for i in range(MAX_NAMESPACES + 100):
        cache.root(SamplingParams(cache_salt=f"user-{i}").cache_namespace)
    assert cache.num_namespaces == MAX_NAMESPACES


def test_a_forgotten_namespace_misses_its_old_entries() -> None:
    alloc = AllocatorCore(block_size=BS, num_gpu_blocks=32, num_cpu_blocks=0)
    alloc.cache.max_namespaces = 1
    grant(alloc, "x1", NS_SALT)
    apply(alloc, CacheBlocks("x1", PROMPT[:8]), FreeRequest("x1"))
    assert grant(alloc, "x2", NS_SALT).num_cached_tokens == 8  # remembered: a hit
    grant(alloc, "a1", NS_A)  # the one root left is a's now
    assert grant(alloc, "x3", NS_SALT).num_cached_tokens == 0  # unreachable, never wrong


# -- the scheduler: namespaces on AllocateNew, and the leaders rule -----------------------------


def lora_rig(max_loras: int = 0, chunk: int = 0, **kw: Any) -> Rig:
    """test_scheduler's Rig with a scheduler limited to max_loras adapters and chunk tokens."""
    rig = Rig(**kw)
    rig.s = SchedulerCore(
        replace(rig.s.limits, max_chunk_tokens=chunk, max_loras=max_loras),
        num_cpu_blocks=rig.s.num_cpu_blocks,
        preemption_mode=kw.get("mode", "auto"),
        scheduling_policy=kw.get("policy", "priority"),
        eos_token_ids=[2],
    )
    return rig


def starts(batch: AllocateBatch) -> dict[str, str]:
    """The batch's AllocateNew ops: request id -> namespace."""
    return {op.request_id: op.namespace for op in batch.ops if isinstance(op, AllocateNew)}


def test_allocate_new_carries_the_namespace_and_the_cache_keeps_it() -> None:
    rig = lora_rig()
    rig.add("base", PROMPT)
    rig.step()
    rig.add("a1", PROMPT, lora="a")
    rig.add("salted", PROMPT, cache_salt="x")
    batch, _, _ = rig.step()
    assert starts(batch) == {"a1": NS_A, "salted": NS_SALT}
    assert rig.s.requests["a1"].num_cached_tokens == 0
    assert rig.s.requests["salted"].num_cached_tokens == 0
    rig.add("a2", PROMPT, lora="a")
    rig.add("base2", PROMPT)
    batch, _, _ = rig.step()
    assert starts(batch) == {"a2": NS_A, "base2": BASE}
    assert rig.s.requests["a2"].num_cached_tokens == 8  # a1's blocks
    assert rig.s.requests["base2"].num_cached_tokens == 8  # base's


def test_a_prompt_waits_only_for_a_leader_of_its_own_namespace() -> None:
    rig = lora_rig(chunk=8, num_gpu=64)  # a 20-token prompt prefills over 3 steps
    long = prompt(20)
    rig.add("lead", long, ignore_eos=True)
    rig.step()  # lead: 8 of 20 computed
    rig.add("base2", long, ignore_eos=True)  # same first block and namespace: waits for lead
    rig.add("a1", long, lora="a", ignore_eos=True)  # another namespace: no reason to wait
    rig.add("a2", long, lora="a", ignore_eos=True)  # waits for a1, its namespace's leader
    batch, _, _ = rig.step()
    assert starts(batch) == {"a1": NS_A}
    assert [r.request_id for r in rig.s.queues.waiting] == ["base2", "a2"]
    assert rig.s.requests["a1"].num_cached_tokens == 0  # lead's 8 cached tokens are not a's
    batch, _, _ = rig.step()  # lead computes its last 4; a1 8 more
    assert starts(batch) == {}
    batch, _, _ = rig.step()  # lead is cached, a1 computes its last 4
    assert starts(batch) == {"base2": BASE}
    assert rig.s.requests["base2"].num_cached_tokens == 16
    batch, _, _ = rig.step()
    assert starts(batch) == {"a2": NS_A}
    assert rig.s.requests["a2"].num_cached_tokens == 16  # a1's, not lead's (same tokens)


# -- max_loras ------------------------------------------------------------------------------------


def run_all(rig: Rig, loras: dict[str, str | None], max_loras: int) -> list[StepPlan]:
    """Step until nothing is left: every plan spans at most max_loras adapters, every start
    names its request's namespace; every request ends by length. The plans."""
    plans: list[StepPlan] = []
    ended: dict[str, FinishReason | None] = {}
    while (batch := rig.s.schedule()) is not None:
        for rid, namespace in starts(batch).items():
            assert namespace == SamplingParams(lora=loras[rid]).cache_namespace, rid
        plan = rig.s.on_allocated(rig.a.apply(batch))
        check_allocator(rig.a)
        if plan is None:
            continue
        adapters = {loras[w.request_id] for w in plan.seqs} - {None}
        assert len(adapters) <= max_loras, f"step {plan.step_id} runs adapters {adapters}"
        plans.append(plan)
        out = rig.s.update(StepResult(step_id=plan.step_id, time=1.0, sampled=rig.r.execute(plan)))
        ended |= {o.request_id: o.finish_reason for o in out.outputs if o.finish_reason}
    assert ended == dict.fromkeys(loras, FinishReason.LENGTH)
    return plans


def add_all(rig: Rig, loras: dict[str, str | None], num_tokens: int = 5, **kw: Any) -> None:
    for i, (rid, lora) in enumerate(loras.items()):
        rig.add(rid, prompt(num_tokens, 100 * (i + 1)), lora=lora, ignore_eos=True, **kw)


def ran(plan: StepPlan) -> list[str]:
    return [w.request_id for w in plan.seqs]


def test_max_loras_1_runs_one_adapter_per_step_beside_base_requests() -> None:
    rig = lora_rig(max_loras=1)
    loras = {"a1": "a", "b1": "b", "a2": "a", "base": None}
    add_all(rig, loras, max_tokens=6)
    plans = run_all(rig, loras, max_loras=1)
    assert ran(plans[0]) == ["a1", "a2", "base"]  # b1 steps aside; base runs beside a
    first_b = next(i for i, p in enumerate(plans) if "b1" in ran(p))
    assert all("a1" not in ran(p) and "a2" not in ran(p) for p in plans[first_b:])


def test_max_loras_counts_requests_started_in_the_same_step() -> None:
    rig = lora_rig(max_loras=2)
    loras = {"a": "a", "b": "b", "c": "c", "a2": "a", "base": None}
    add_all(rig, loras, max_tokens=4)
    plans = run_all(rig, loras, max_loras=2)
    assert ran(plans[0]) == ["a", "b", "a2", "base"]


def test_skipped_requests_keep_their_order_while_later_ones_start() -> None:
    rig = lora_rig(max_loras=1)
    rig.add("a1", prompt(5), lora="a", ignore_eos=True, max_tokens=3)
    rig.step()
    for i, (rid, lora) in enumerate((("b1", "b"), ("x", None), ("a2", "a"), ("b2", "b"))):
        rig.add(rid, prompt(5, 200 + 100 * i), lora=lora, ignore_eos=True, max_tokens=3)
    rig.add("c1", prompt(5, 700), lora="c", ignore_eos=True, max_tokens=3)
    batch, plan, _ = rig.step()
    assert set(starts(batch)) == {"x", "a2"} and ran(plan) == ["a1", "x", "a2"]
    assert [r.request_id for r in rig.s.queues.waiting] == ["b1", "b2", "c1"]
    loras = {"a1": "a", "b1": "b", "x": None, "a2": "a", "b2": "b", "c1": "c"}
    plans = run_all(rig, loras, max_loras=1)
    b_steps = [i for i, p in enumerate(plans) if {"b1", "b2"} & set(ran(p))]
    c_steps = [i for i, p in enumerate(plans) if "c1" in ran(p)]
    assert b_steps and c_steps and max(b_steps) < min(c_steps)  # b (first in line) before c


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preempted_requests_keep_to_max_loras(mode: str) -> None:
    rig = lora_rig(max_loras=1, num_gpu=6, num_cpu=8, mode=mode, caching=False)
    loras = {"a1": "a", "x": None, "a2": "a", "b1": "b", "b2": "b"}
    add_all(rig, loras, num_tokens=4, max_tokens=8)
    plans = run_all(rig, loras, max_loras=1)
    stats = rig.s.stats()
    preempted = stats.num_preemptions_swap if mode == "swap" else stats.num_preemptions_recompute
    assert preempted > 0  # the pool is too small for a1, x, a2 decoding at once
    assert any("b1" in ran(p) for p in plans)


def test_a_swapped_request_of_another_adapter_waits_and_holds_the_queue() -> None:
    # Under a fixed limit a swapped request's adapter was running when it left, and nothing
    # starts while it is away, so this state needs the limit lowered after the swap-out.
    rig = lora_rig(max_loras=2, num_gpu=4, num_cpu=4, caching=False)
    rig.add("a1", prompt(4, 100), lora="a", ignore_eos=True, max_tokens=6)
    rig.add("x", prompt(4, 200), ignore_eos=True, max_tokens=2)
    rig.add("b1", prompt(4, 300), lora="b", ignore_eos=True, max_tokens=3)
    rig.step()
    rig.step()  # each needs a second block: b1, the last, is swapped out
    assert [r.request_id for r in rig.s.queues.swapped] == ["b1"]
    rig.s.planner.limits = replace(rig.s.planner.limits, max_loras=1)
    rig.add("y", prompt(3, 400), ignore_eos=True, max_tokens=2)  # waits behind b1
    assert "x" not in rig.s.requests  # ended by length: its blocks come back next step
    plans = run_all(rig, {"a1": "a", "b1": "b", "y": None}, max_loras=1)
    first_b = next(i for i, p in enumerate(plans) if "b1" in ran(p))
    assert first_b > 0 and all("a1" not in ran(p) for p in plans[first_b:])  # after a1 ended
    first_y = next(i for i, p in enumerate(plans) if "y" in ran(p))
    assert first_y == first_b  # the swapped b1 held the waiting queue until it came back


# -- the graph: EngineConfig.max_loras reaches the scheduler ------------------------------------


def test_build_scheduler_takes_max_loras_only_with_lora_modules() -> None:
    numbers = RunnerNumbers(
        block_size=16, num_gpu_blocks=8, num_cpu_blocks=0, vocab_size=100, max_model_len=64,
        eos_token_ids=(2,),
    )  # fmt: skip
    tokenizer = cast(Any, None)  # the scheduler reads no tokenizer
    served = EngineConfig(lora_modules=("a=/adapters/a", "b=/adapters/b"), max_loras=3)
    assert build_scheduler(GraphInputs(served, numbers, tokenizer)).limits.max_loras == 3
    base = EngineConfig(max_loras=3)
    assert build_scheduler(GraphInputs(base, numbers, tokenizer)).limits.max_loras == 0


ENGINE_LORAS = {"a1": "a", "b1": "b", "a2": "a", "base": None, "b2": "b", "a3": "a"}


@pytest.mark.anyio
async def test_engine_plans_at_most_max_loras_adapters_and_replays(tmp_path: Any) -> None:
    trace = tmp_path / "lora.trace"
    config = EngineConfig(
        runner="fake", num_kv_blocks=64, block_size=4, max_loras=1, trace_path=str(trace),
        lora_modules=("a=/adapters/a", "b=/adapters/b"),
    )  # fmt: skip
    ends: dict[str, StreamEvent] = {}
    async with Engine.open(config) as engine:

        async def one(rid: str, lora: str | None) -> None:
            params = SamplingParams(max_tokens=12, lora=lora, ignore_eos=True)
            ends[rid] = terminal(await collect(engine, list(PROMPT), params, request_id=rid))

        async with anyio.create_task_group() as tg:
            for rid, lora in ENGINE_LORAS.items():
                tg.start_soon(one, rid, lora)
    for rid, end in ends.items():
        assert isinstance(end, Finished) and end.finish_reason == FinishReason.LENGTH, rid
    assert set(ends) == set(ENGINE_LORAS)
    _, records = read_trace(trace)
    lora_of = {
        r.msg.request_id: r.msg.params.lora
        for r in records
        if r.kind == "recv" and r.actor == "scheduler" and isinstance(r.msg, AdmittedRequest)
    }
    assert lora_of == ENGINE_LORAS
    sent = [r.msg for r in records if r.kind == "send" and r.actor == "scheduler"]
    plans = [msg for msg in sent if isinstance(msg, StepPlan)]
    assert plans
    for plan in plans:
        adapters = {lora_of[w.request_id] for w in plan.seqs} - {None}
        assert len(adapters) <= 1, f"step {plan.step_id} runs adapters {adapters}"
    batches = [msg for msg in sent if isinstance(msg, AllocateBatch)]
    namespaces = {rid: ns for b in batches for rid, ns in starts(b).items()}
    assert namespaces == {rid: SamplingParams(lora=v).cache_namespace for rid, v in lora_of.items()}
    report = replay_trace(trace)
    assert report.ok, report.divergence and report.divergence.describe()
