"""The queues' per-adapter counts (actors/core/adapter_counts.py), which the scheduler's stats and
the max_loras gate read instead of scanning the queues, stay exactly what a scan of the queues
finds: checked after every call into the scheduler through admission, the max_loras gate's
set-asides, preemption by swap and by recompute, parallel sampling's forks, a late token,
finish and abort, and under random workloads on tiny pools."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import chain

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from troupe.actors.core.request_queues import RequestQueues
from troupe.actors.core.request_state import Request, Status
from troupe.messages import StepResult

from tests.actors.core.test_scheduler import Rig, prompt
from tests.actors.core.test_scheduler_late import LateRig
from tests.actors.core.test_scheduler_late import _late as late_tokens
from tests.lora.test_lora_scheduling import lora_rig

ADAPTERS = (None, "a", "b", "c")


def _scan(requests: Iterable[Request]) -> Counter[str]:
    return Counter(r.params.lora for r in requests if r.params.lora is not None)


def check_counts(rig: Rig) -> None:
    """The counts, the names and the stats against a brute-force scan of the queues."""
    q: RequestQueues = rig.s.queues
    running, queued = _scan(chain(q.running, q.awaiting)), _scan(chain(q.waiting, q.swapped))
    assert q.adapters.running == running
    assert q.adapters.queued == queued
    names = tuple(sorted(running)), tuple(sorted(queued))
    stats = rig.s.stats()
    assert (stats.running_lora_adapters, stats.waiting_lora_adapters) == names


def drive(rig: Rig, aborts: dict[int, list[str]] | None = None, max_steps: int = 300) -> None:
    """Step until the scheduler is idle, checking the counts after every call; `aborts`: the
    requests aborted before step i is scheduled (and some while it is in flight)."""
    aborts = aborts or {}
    check_counts(rig)
    for step in range(max_steps):
        for rid in aborts.get(step, ()):
            rig.s.abort(rid)
            check_counts(rig)
        batch = rig.s.schedule()
        check_counts(rig)
        if batch is None:
            if not rig.s.queues.requests:
                return
            continue  # refused or deferred: the next call plans again
        plan = rig.s.on_allocated(rig.a.apply(batch))
        check_counts(rig)
        for rid in aborts.get(-step - 1, ()):  # in flight
            rig.s.abort(rid)
            check_counts(rig)
        if plan is not None:
            sampled = rig.r.execute(plan)
            rig.s.update(StepResult(step_id=plan.step_id, time=1.0, sampled=sampled))
            check_counts(rig)
    raise AssertionError(f"not idle after {max_steps} steps: {list(rig.s.queues.requests)}")


def _swapping_rig(mode: str) -> Rig:
    """Three requests whose second blocks do not all fit: the last is preempted by `mode`."""
    rig = lora_rig(max_loras=2, num_gpu=4, num_cpu=4, caching=False, mode=mode)
    rig.add("a1", prompt(4, 100), lora="a", ignore_eos=True, max_tokens=6)
    rig.add("x", prompt(4, 200), ignore_eos=True, max_tokens=2)
    rig.add("b1", prompt(4, 300), lora="b", ignore_eos=True, max_tokens=3)
    return rig


def test_exact_through_swap_preemption() -> None:
    rig = _swapping_rig("swap")
    drive(rig)
    assert rig.s.stats().num_preemptions_swap > 0
    assert rig.s.queues.adapters.running == rig.s.queues.adapters.queued == {}


def test_exact_through_recompute_preemption() -> None:
    rig = _swapping_rig("recompute")
    drive(rig)
    assert rig.s.stats().num_preemptions_recompute > 0
    assert rig.s.queues.adapters.running == rig.s.queues.adapters.queued == {}


def test_exact_through_the_gate_forks_and_aborts() -> None:
    rig = lora_rig(max_loras=1)
    for i, (rid, lora) in enumerate([("b1", "b"), ("a1", "a"), ("x", None), ("b2", "b")]):
        rig.add(rid, prompt(5, 100 * (i + 1)), lora=lora, ignore_eos=True, max_tokens=2 + 2 * i)
    rig.add("c1", prompt(5, 700), lora="c", ignore_eos=True, max_tokens=6)
    rig.add("c2", prompt(5, 800), lora="c", ignore_eos=True, max_tokens=6, n=2)  # forked
    rig.add("a2", prompt(5, 900), lora="a", ignore_eos=True, max_tokens=4)
    check_counts(rig)
    assert rig.s.queues.adapters.queued == {"a": 2, "b": 2, "c": 2}
    # a2 aborted waiting, b2 running, c2's samples in flight
    drive(rig, {0: ["a2"], 1: ["b2"], -9: ["c2"]})
    assert rig.s.queues.adapters.running == rig.s.queues.adapters.queued == {}


def test_exact_while_a_token_comes_late() -> None:
    """A request awaiting a late token (prefill/decode disaggregation) counts as running."""
    rig = LateRig()
    rig.s = lora_rig(max_loras=2).s
    rig.add("b", prompt(3), lora="b", max_tokens=6)
    _, _, out = rig.run(rig.handle([]))
    rig.add("a", prompt(6, 200), lora="a", max_tokens=4)
    check_counts(rig)
    _, _, out = rig.run(out)
    plan, [held], out = rig.run(out, late=frozenset({"a"}))
    assert rig.s.requests["a"].status == Status.AWAITING
    check_counts(rig)
    assert rig.s.queues.adapters.running == {"a": 1, "b": 1}
    _, _, out = rig.run(out, before=(late_tokens(plan.step_id, held),))
    assert rig.s.requests["a"].status == Status.RUNNING
    check_counts(rig)
    rig.finish(out)
    check_counts(rig)
    assert rig.s.queues.adapters.running == {}


@st.composite
def workloads(draw: st.DrawFn) -> dict:
    num = draw(st.integers(1, 10))
    reqs = []
    for i in range(num):
        reqs.append(
            {
                "rid": f"r{i}",
                "prompt": prompt(draw(st.integers(1, 12)), 100 + 20 * i),
                "lora": draw(st.sampled_from(ADAPTERS)),
                "max_tokens": draw(st.integers(1, 16)),
                "n": draw(st.sampled_from([1, 1, 1, 2])),
                "priority": draw(st.integers(-1, 1)),
            }
        )
    aborts: dict[int, list[str]] = {}
    for req in reqs:
        if draw(st.integers(0, 3)) == 0:
            aborts.setdefault(draw(st.integers(-12, 12)), []).append(req["rid"])
    return {
        "reqs": reqs,
        "aborts": aborts,
        "num_gpu": draw(st.integers(5, 12)),
        "num_cpu": draw(st.sampled_from([0, 4, 16])),
        "max_seqs": draw(st.integers(1, 6)),
        "budget": draw(st.integers(8, 40)),
        "max_loras": draw(st.integers(1, 3)),
        "mode": draw(st.sampled_from(["auto", "swap", "recompute"])),
        "caching": draw(st.booleans()),
    }


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_exact_under_random_workloads(w: dict) -> None:
    rig = lora_rig(
        max_loras=w["max_loras"],
        num_gpu=w["num_gpu"],
        num_cpu=w["num_cpu"],
        max_seqs=w["max_seqs"],
        budget=w["budget"],
        caching=w["caching"],
        mode=w["mode"],
    )
    for r in w["reqs"]:
        rig.add(
            r["rid"],
            r["prompt"],
            lora=r["lora"],
            max_tokens=r["max_tokens"],
            n=r["n"],
            priority=r["priority"],
            ignore_eos=True,
        )
    drive(rig, w["aborts"])
    assert rig.s.queues.adapters.running == rig.s.queues.adapters.queued == {}
