"""Where a masked step's time goes: `bench_structured` with the masked path's handlers timed.

    python -m troupe.ops.masked_step_probe [bench_structured's flags, e.g. --repeats 3]

Wraps, for the run only, the executor core's plan and mask handlers, the runner's `launch`,
`finish`, `draw_ahead` and `execute`, their pieces (the kept forward's take and launch, the
sampling batch, the mask upload, the read-back, the overlapped decode's take and launch), and
the grammar, scheduler and allocator cores' `handle`, with perf_counter stamps; runs
ops/bench_structured.py; then prints, per masked step (medians over the run, in ms after the
previous masked step's `finish` returned), when its plan and masks reached the executor and
how long `launch` and `finish` took, and each wrapped call's median, p90 and total. The
grammar process's own time is the parent's `handle` (its round trip). docs/benchmarks.md,
sessions 24 and 25, read a run of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

Info = Callable[[Any, tuple[Any, ...], Any], Any]  # (self, args, result) -> what to keep


@dataclasses.dataclass(frozen=True)
class Span:
    start: float
    end: float
    tag: str
    info: Any = None


class Probe:
    """Wraps methods to record a Span per call; `installed()` wraps and restores them."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._originals: list[tuple[type, str, Any]] = []

    def wrap(self, cls: type, name: str, tag: str, info: Info | None = None) -> None:
        original = getattr(cls, name)
        spans, clock = self.spans, time.perf_counter

        def timed(obj: Any, *args: Any, **kwargs: Any) -> Any:
            start = clock()
            result = original(obj, *args, **kwargs)
            spans.append(Span(start, clock(), tag, info(obj, args, result) if info else None))
            return result

        self._originals.append((cls, name, original))
        setattr(cls, name, timed)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Probe]:
        from troupe.actors.core.allocator import AllocatorCore
        from troupe.actors.core.executor import ExecutorCore
        from troupe.actors.core.grammar import GrammarCore
        from troupe.actors.core.scheduler import SchedulerCore
        from troupe.actors.grammar_process import GrammarProcess
        from troupe.gpu.forward_ahead import ForwardAhead
        from troupe.gpu.model_runner import ModelRunner
        from troupe.gpu.overlap import DecodeOverlap
        from troupe.gpu.readback import Readback
        from troupe.gpu.sampling_batch import SamplingBatches
        from troupe.gpu.token_bitmask import BitmaskUpload

        plan_info: Info = lambda _, a, __: (a[0].step_id, a[0].is_masked, a[0].ahead_masks_of)  # noqa: E731
        self.wrap(ExecutorCore, "_on_plan", "plan", plan_info)
        self.wrap(ExecutorCore, "_on_masks", "masks", lambda _, a, __: (a[0].step_id, a[0].ahead))
        for name in ("launch", "finish", "draw_ahead", "execute"):
            self.wrap(ModelRunner, name, name)
        self.wrap(ForwardAhead, "take", "ahead.take")
        self.wrap(ForwardAhead, "launch", "ahead.launch")
        self.wrap(ForwardAhead, "take_drawn", "ahead.take_drawn", lambda _, __, r: r is not None)
        self.wrap(DecodeOverlap, "take", "overlap.take")
        self.wrap(DecodeOverlap, "launch", "overlap.launch")
        self.wrap(SamplingBatches, "build", "batch.build")
        self.wrap(BitmaskUpload, "for_rows", "mask.upload")
        self.wrap(Readback, "read", "readback.read")
        self.wrap(GrammarProcess, "handle", "grammar")
        self.wrap(GrammarCore, "handle", "grammar")
        self.wrap(SchedulerCore, "handle", "scheduler")
        self.wrap(AllocatorCore, "handle", "allocator")
        try:
            yield self
        finally:
            for cls, name, original in reversed(self._originals):
                setattr(cls, name, original)
            self._originals.clear()


def masked_steps(spans: list[Span]) -> dict[str, list[float]]:
    """Per masked step after another (seconds after the previous one's `finish` returned):
    its plan's and its masks' arrival at the executor, `launch`, `finish`, the whole step."""
    spans = sorted(spans, key=lambda s: s.start)
    finishes = [s for s in spans if s.tag == "finish"]
    rows: dict[str, list[float]] = {
        k: [] for k in ("plan arrives", "masks arrive", "launch", "finish", "step")
    }
    for before, after in itertools.pairwise(finishes):
        base = before.end
        inside = [s for s in spans if base <= s.start <= after.start]
        plan = next((s for s in inside if s.tag == "plan" and s.info[1]), None)
        launch = next((s for s in inside if s.tag == "launch"), None)
        if plan is None or launch is None:
            continue  # not two masked steps in a row
        masks = [s for s in inside if s.tag == "masks"]
        rows["plan arrives"].append(plan.start - base)
        if masks:
            rows["masks arrive"].append(masks[-1].start - base)
        rows["launch"].append(launch.end - launch.start)
        rows["finish"].append(after.end - after.start)
        rows["step"].append(after.end - base)
    return rows


def report(spans: list[Span]) -> list[str]:
    def ms(values: list[float]) -> str:
        if not values:
            return "-"
        p90 = statistics.quantiles(values, n=10)[-1] if len(values) > 2 else max(values)
        return f"median {1e3 * statistics.median(values):.2f} p90 {1e3 * p90:.2f} ms"

    rows = masked_steps(spans)
    lines = [f"masked steps after a masked step: {len(rows['step'])}"]
    lines += [f"  {name:14s} {ms(values)}" for name, values in rows.items()]
    lines.append("calls:")
    for tag in dict.fromkeys(s.tag for s in spans):
        took = [s.end - s.start for s in spans if s.tag == tag]
        lines.append(f"  {tag:18s} {len(took):6d}  {ms(took)}  total {sum(took):.2f} s")
    drawn = [s.info for s in spans if s.tag == "ahead.take_drawn"]
    if drawn:
        lines.append(f"draws confirmed by their plan: {sum(drawn)} of {len(drawn)} masked plans")
    return lines


def main(argv: list[str] | None = None) -> int:
    from troupe.ops import bench_structured

    with Probe().installed() as probe:
        code = bench_structured.main(argv)
    print("\n".join(report(probe.spans)))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
