"""The two policy seams: queue order (fcfs, priority) and preemption (victim; swap or
recompute), each chosen by name from EngineConfig."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from troupe.config import ConfigError, EngineConfig
from troupe.messages.allocator import FreeRequest, Grow
from troupe.policies.preemption import (
    PREEMPTION_POLICIES,
    Holding,
    R,
    Recompute,
    SwapWhenRoom,
    make_preemption_policy,
)
from troupe.policies.queue import QUEUE_POLICIES, Queued, make_queue_policy

from tests.actors.core.test_scheduler import Rig, prompt


def test_config_checks_names_against_the_registries() -> None:
    assert EngineConfig().scheduling_policy == "priority"
    for name in QUEUE_POLICIES:
        EngineConfig(scheduling_policy=name)
    for name in PREEMPTION_POLICIES:
        EngineConfig(preemption_mode=name)
    with pytest.raises(ConfigError, match="scheduling_policy must be one of fcfs, priority"):
        EngineConfig(scheduling_policy="lifo")
    with pytest.raises(ConfigError, match="preemption_mode must be one of auto, swap, recompute"):
        EngineConfig(preemption_mode="never")
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        make_queue_policy("lifo")
    with pytest.raises(ValueError, match="preemption_mode must be one of auto, swap, recompute"):
        make_preemption_policy("never")


def _admitted(policy: str) -> list[str]:
    rig = Rig(max_seqs=2, policy=policy)
    rig.add("first", prompt(2))
    rig.add("urgent", prompt(2, 200), priority=-5)
    rig.add("lazy", prompt(2, 300), priority=7)
    _, plan, _ = rig.step()
    return [w.request_id for w in plan.seqs] + [r.request_id for r in rig.s.queues.waiting]


def test_fcfs_ignores_priority_and_priority_serves_lower_values_first() -> None:
    assert _admitted("fcfs") == ["first", "urgent", "lazy"]
    assert _admitted("priority") == ["urgent", "first", "lazy"]


def test_swap_when_room_and_recompute_choose_the_last_in_queue_order() -> None:
    rig = Rig()
    rig.add("a", prompt(4))
    rig.add("b", prompt(4, 200))
    reqs = list(rig.s.queues.waiting)
    reqs[1].num_blocks = 3
    for policy in (SwapWhenRoom(), Recompute()):
        assert policy.victim(reqs) is reqs[1]
    assert SwapWhenRoom().swaps(reqs[1], 3) and not SwapWhenRoom().swaps(reqs[1], 2)
    assert not Recompute().swaps(reqs[1], 100)
    assert not SwapWhenRoom().swaps(reqs[0], 100)  # nothing on the GPU: nothing to swap


class FirstGivesWay:
    """A test policy: the most urgent request gives way (to show the seam takes any victim)."""

    def victim(self, running: Sequence[R]) -> R:
        return running[0]

    def swaps(self, victim: Holding, num_cpu_free: int) -> bool:
        return False


class Lifo:
    """A test policy: the latest arrival first."""

    def sort_key(self, req: Queued) -> tuple[int, ...]:
        return (-req.arrival_seq,)


def test_a_registry_entry_is_all_a_new_policy_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry is the one place a name lives: an entry makes it valid in EngineConfig and
    is what the scheduler builds (what a new policy's one file adds, done here by the test)."""
    monkeypatch.setitem(PREEMPTION_POLICIES, "first", FirstGivesWay)
    monkeypatch.setitem(QUEUE_POLICIES, "lifo", Lifo)
    config = EngineConfig(preemption_mode="first", scheduling_policy="lifo")
    rig = Rig(num_gpu=4, mode=config.preemption_mode, policy=config.scheduling_policy)
    assert isinstance(rig.s.planner.preemption, FirstGivesWay)
    for rid, base in (("a", 100), ("b", 200), ("c", 300)):
        rig.add(rid, prompt(4, base))
    assert [r.request_id for r in rig.s.queues.waiting] == ["c", "b", "a"]


def test_a_new_preemption_policy_plugs_into_the_planner() -> None:
    rig = Rig(num_gpu=4, caching=False)
    rig.s.planner.preemption = FirstGivesWay()
    for rid, base in (("a", 100), ("b", 200), ("c", 300)):
        rig.add(rid, prompt(4, base))
    rig.step()  # three blocks used, one free; each now needs a second
    batch, plan, _ = rig.step()
    assert batch.ops == (FreeRequest("a"), Grow("b", 5), Grow("c", 5))
    assert [w.request_id for w in plan.seqs] == ["b", "c"]
    assert [r.request_id for r in rig.s.queues.waiting] == ["a"]
