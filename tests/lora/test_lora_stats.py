"""The scheduler's EngineStats name the LoRA adapters in use (troupe_lora_requests_info): those
of the running requests and those of the queued ones (waiting, swapped), each sorted, in the
stats of every step; not counted at all when the engine serves no adapters (max_loras 0)."""

from __future__ import annotations

from troupe.messages import EngineStats, StepResult
from troupe.messages.engine_protocol import (
    HEADER_BYTES,
    EventBatch,
    encode_frame,
    from_engine_decoder,
)

from tests.actors.core.test_scheduler import prompt
from tests.lora.test_lora_scheduling import lora_rig


def _adapters(stats: EngineStats | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    assert stats is not None
    return stats.running_lora_adapters, stats.waiting_lora_adapters


def test_stats_name_the_adapters_of_running_and_waiting_requests() -> None:
    rig = lora_rig(max_loras=1)
    for i, (rid, lora) in enumerate([("b1", "b"), ("a1", "a"), ("x", None), ("b2", "b")]):
        rig.add(rid, prompt(5, 100 * (i + 1)), lora=lora, ignore_eos=True, max_tokens=2 + 2 * i)
    rig.add("c1", prompt(5, 700), lora="c", ignore_eos=True, max_tokens=2)
    assert _adapters(rig.s.stats()) == ((), ("a", "b", "c"))  # all queued, sorted
    assert rig.s.stats().max_loras == 1
    _, plan, out = rig.step()  # b1, x and b2 start; a1 and c1 wait for b's requests to end
    assert {w.request_id for w in plan.seqs} == {"b1", "x", "b2"}
    assert _adapters(out.stats) == (("b",), ("a", "c"))
    seen = [_adapters(out.stats)]
    while (batch := rig.s.schedule()) is not None:
        plan = rig.s.on_allocated(rig.a.apply(batch))
        if plan is not None:
            sampled = rig.r.execute(plan)
            out = rig.s.update(StepResult(step_id=plan.step_id, time=1.0, sampled=sampled))
            if _adapters(out.stats) != seen[-1]:
                seen.append(_adapters(out.stats))
    # a (first in line) runs once b's requests end, then c. The step a request ends in shows
    # it gone; the one that starts the next adapter's requests shows them running.
    assert seen == [
        (("b",), ("a", "c")),
        ((), ("a", "c")),
        (("a",), ("c",)),
        ((), ("c",)),
        (("c",), ()),
        ((), ()),
    ]


def test_a_swapped_request_counts_as_waiting() -> None:
    rig = lora_rig(max_loras=2, num_gpu=4, num_cpu=4, caching=False)
    rig.add("a1", prompt(4, 100), lora="a", ignore_eos=True, max_tokens=6)
    rig.add("x", prompt(4, 200), ignore_eos=True, max_tokens=2)
    rig.add("b1", prompt(4, 300), lora="b", ignore_eos=True, max_tokens=3)
    rig.step()
    _, _, out = rig.step()  # each needs a second block: b1, the last, is swapped out
    assert [r.request_id for r in rig.s.queues.swapped] == ["b1"]
    assert _adapters(out.stats) == (("a",), ("b",))


def test_without_adapters_the_queues_are_not_read() -> None:
    rig = lora_rig(max_loras=0)  # the engine serves no adapters: no gate, nothing counted
    rig.add("a1", prompt(5), lora="a", ignore_eos=True, max_tokens=4)
    rig.add("b1", prompt(5, 200), lora="b", ignore_eos=True, max_tokens=4)
    _, _, out = rig.step()
    assert out.stats is not None and out.stats.num_running == 2 and out.stats.max_loras == 0
    assert _adapters(out.stats) == ((), ())


def test_the_adapters_travel_to_the_gateway_process() -> None:
    stats = EngineStats(max_loras=2, running_lora_adapters=("a", "b"), waiting_lora_adapters=("c",))
    batch = EventBatch(events=(), stats=stats, time=1.0)
    assert from_engine_decoder.decode(encode_frame(batch)[HEADER_BYTES:]) == batch
