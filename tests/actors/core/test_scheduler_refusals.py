"""The scheduler handles each refusal of the allocator: a refused Grow waits (shrink), a refused
AllocateNew or SwapIn goes back to its queue, a refused SwapOut is recomputed. Driven with
hand-edited AllocationResults, so each case happens exactly once."""

from __future__ import annotations

import msgspec
from troupe.actors.core.request_state import Status
from troupe.messages.allocator import AllocateBatch, AllocateNew, FreeRequest, Grow, SwapIn, SwapOut
from troupe.messages.executor import StepPlan
from troupe.messages.scheduler import Refusal, RefusalReason, StepResult

from tests.actors.core.allocator_invariants import check_allocator
from tests.actors.core.test_scheduler import Rig, prompt

NO_GPU, NO_CPU = RefusalReason.NO_GPU_BLOCKS, RefusalReason.NO_CPU_BLOCKS


def refuse(
    rig: Rig, rid: str, reason: RefusalReason = NO_GPU
) -> tuple[AllocateBatch, StepPlan | None]:
    """One step in which the allocator refuses `rid`'s op (dropped, as a refusal changes
    nothing; a refused SwapOut frees the request instead)."""
    batch = rig.s.schedule()
    assert batch is not None
    ops = []
    for op in batch.ops:
        if op.request_id != rid or isinstance(op, FreeRequest):
            ops.append(op)
        elif isinstance(op, SwapOut):
            ops.append(FreeRequest(rid))
    result = rig.a.apply(AllocateBatch(step_id=batch.step_id, ops=tuple(ops)))
    refusals = (*result.refused, Refusal(rid, reason))
    plan = rig.s.on_allocated(msgspec.structs.replace(result, refused=refusals))
    check_allocator(rig.a)
    if plan is not None:
        rig.s.update(StepResult(step_id=plan.step_id, time=1.0, sampled=rig.r.execute(plan)))
    return batch, plan


def test_refused_allocate_new_waits_and_is_admitted_next_step() -> None:
    rig = Rig()
    rig.add("a", prompt(5))
    batch, plan = refuse(rig, "a")
    assert batch.ops == (AllocateNew("a", prompt(5), 5),) and plan is None
    req = rig.s.requests["a"]
    assert req.status == Status.WAITING and not req.in_allocator and req.num_blocks == 0
    _, plan, _ = rig.step()
    assert [(w.request_id, w.reset, w.num_tokens) for w in plan.seqs] == [("a", True, 5)]


def test_refused_grow_shrinks_the_step_and_retries() -> None:
    rig = Rig()
    rig.add("a", prompt(4))  # one full block: its first decode needs a second
    rig.add("b", prompt(3, 200))
    rig.step()
    batch, plan = refuse(rig, "a")
    assert Grow("a", 5) in batch.ops and plan is not None
    assert [w.request_id for w in plan.seqs] == ["b"]  # a sits this step out, still running
    assert rig.s.requests["a"].status == Status.RUNNING and rig.s.requests["a"].num_blocks == 1
    batch, plan, _ = rig.step()
    assert Grow("a", 5) in batch.ops and [w.request_id for w in plan.seqs] == ["a", "b"]
    assert plan.seqs[0].block_ids == (2,) and not plan.seqs[0].reset


def test_refused_swap_in_goes_back_to_swapped() -> None:
    rig = Rig(num_gpu=4, num_cpu=4, caching=False)
    for rid, base in (("a", 100), ("b", 200), ("c", 300)):
        rig.add(rid, prompt(4, base))
    rig.step()
    rig.step()  # c is swapped out
    rig.s.abort("a")
    batch, plan = refuse(rig, "c")
    assert batch.ops == (FreeRequest("a"), SwapIn("c", 5))
    assert [r.request_id for r in rig.s.queues.swapped] == ["c"]
    assert rig.s.requests["c"].num_cpu_blocks == 1 and rig.a.seqs["c"].cpu_blocks == [0]
    batch, plan, _ = rig.step()
    works = {w.request_id: w for w in plan.seqs}
    assert batch.ops[-1] == SwapIn("c", 5) and plan.swap_in == ((0, works["c"].block_ids[0]),)


def test_refused_swap_out_is_recomputed() -> None:
    rig = Rig(num_gpu=4, num_cpu=4, caching=False)
    for rid, base in (("a", 100), ("b", 200), ("c", 300)):
        rig.add(rid, prompt(4, base))
    rig.step()
    batch, plan = refuse(rig, "c", NO_CPU)
    assert batch.ops[0] == SwapOut("c") and plan is not None and plan.swap_out == ()
    req = rig.s.requests["c"]
    assert req.status == Status.WAITING and req.num_computed == 0 and not req.in_allocator
    stats = rig.s.stats()
    assert (stats.num_preemptions_swap, stats.num_preemptions_recompute) == (0, 1)
    while rig.s.requests:
        rig.step()
    rig.allocate()  # frees the last request's blocks
    assert not rig.a.seqs and rig.a.gpu.num_free == rig.a.gpu.num_blocks


def test_planner_counts_shared_blocks_as_staying() -> None:
    """Releasing a request frees only the blocks nobody else holds: the planner counts that
    (from the allocator's `shared` report), so it does not admit what would not fit."""
    rig = Rig(num_gpu=6, budget=16)
    rig.add("a", prompt(9), max_tokens=8)  # 3 blocks; its 2 full ones get cached
    rig.step()
    rig.add("b", prompt(9), max_tokens=8)
    rig.step()  # b hits a's 2 full blocks: 4 blocks in use, 2 free
    assert (rig.s.requests["a"].num_blocks, rig.s.requests["a"].num_shared) == (3, 2)
    rig.s.abort("a")
    rig.add("c", prompt(15, 500))  # needs 4 blocks: only 2 + a's 1 unshared are there
    batch, _ = rig.allocate()
    assert FreeRequest("a") in batch.ops and not any(op.request_id == "c" for op in batch.ops)
    assert rig.s.pools.refused == () and rig.s.pools.num_gpu_free == 3
    assert [r.request_id for r in rig.s.queues.waiting] == ["c"]
