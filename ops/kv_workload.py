"""The fixed-length offline workload of issues 9 and 12, driven straight through a Runner.

N requests of P prompt and O output tokens (ignore_eos, greedy) run through `Runner.execute`
by a local loop, no actors: a request is admitted when the blocks for its whole P + O tokens are
free (so nothing is ever preempted), and each step carries every running decode first, then
prefill chunks of the waiting prompts up to the token budget. `max_running` caps the requests
in flight (e.g. 256: two equal waves of a 512-request run, where a pool that fits 418 leaves a
tail wave of 94).

With `timed`, the runner is wrapped in a TimedRunner and the result carries the step timeline:
`summary_lines` splits the run into its prefill steps and its decode steps by how many
sequences each carried, and says how much of the wall time was spent outside `execute` (this
loop's own planning, which overlap cannot hide). `ops/fp8_kv_bench.py workload` runs it with
the Llama-3.1-8B shape on the GPU; the tests run it with the fake runner.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence

from troupe.gpu.runner import Runner
from troupe.gpu.timed_runner import StepTime, TimedRunner
from troupe.messages import SamplingParams, SeqWork, StepPlan


@dataclasses.dataclass
class WorkloadResult:
    outputs: list[list[int]]  # each request's output token ids
    seconds: float
    peak_running: int
    steps: list[StepTime]  # empty unless timed

    @property
    def output_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)


def run_workload(
    runner: Runner,
    *,
    num_blocks: int,
    block_size: int,
    num_seqs: int,
    prompt_len: int,
    output_len: int,
    budget: int,
    max_running: int | None = None,
    timed: bool = False,
) -> WorkloadResult:
    """Run the workload to its end (see the module doc); the caller synchronizes the device."""
    timer = TimedRunner(runner) if timed else None
    step_runner: Runner = timer if timer is not None else runner
    per_seq = -(-(prompt_len + output_len) // block_size)
    if per_seq > num_blocks:
        raise ValueError(f"a request needs {per_seq} blocks, the pool has {num_blocks}")
    cap = max_running or num_seqs
    free = list(range(num_blocks))
    waiting = list(range(num_seqs))
    done = [0] * num_seqs
    outs: list[list[int]] = [[] for _ in range(num_seqs)]
    tables: dict[int, list[int]] = {}
    running: list[int] = []
    prompts = [
        [(7 * s + 13 * i) % 100_000 + 10 for i in range(prompt_len)] for s in range(num_seqs)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    step = peak_running = 0
    start = time.perf_counter()
    while waiting or running:
        while waiting and len(free) >= per_seq and len(running) < cap:
            seq = waiting.pop(0)
            tables[seq], free = free[:per_seq], free[per_seq:]
            running.append(seq)
        peak_running = max(peak_running, len(running))
        step += 1
        plan = StepPlan(
            step_id=step, seqs=_works(running, prompts, outs, done, tables, budget, params)
        )
        finished = []
        for token in step_runner.execute(plan):
            seq = int(token.request_id)
            outs[seq].append(token.token_id)
            if len(outs[seq]) == output_len:
                finished.append(seq)
        for seq in finished:
            running.remove(seq)
            free += tables.pop(seq)
        if finished:
            released = tuple(map(str, finished))
            step_runner.execute(StepPlan(step_id=step, seqs=(), released=released))
    seconds = time.perf_counter() - start
    steps = [s for s in timer.steps if s.num_seqs] if timer is not None else []
    return WorkloadResult(outs, seconds, peak_running, steps)


def _works(
    running: Sequence[int],
    prompts: Sequence[Sequence[int]],
    outs: Sequence[Sequence[int]],
    done: list[int],
    tables: dict[int, list[int]],
    budget: int,
    params: SamplingParams,
) -> tuple[SeqWork, ...]:
    """One step: every running decode, then prefill chunks while the budget lasts."""
    works = []
    prompt_len = len(prompts[0])
    for seq in running:
        if done[seq] >= prompt_len:
            works.append(SeqWork(request_id=str(seq), token_ids=(outs[seq][-1],),
                                 start_pos=done[seq], block_ids=()))  # fmt: skip
            done[seq] += 1
            budget -= 1
    for seq in running:
        if done[seq] < prompt_len and budget > 0:
            first = done[seq] == 0
            tokens = prompts[seq][done[seq] : done[seq] + budget]
            works.append(SeqWork(
                request_id=str(seq), token_ids=tuple(tokens), start_pos=done[seq],
                block_ids=tuple(tables[seq]) if first else (), reset=first,
                sample=done[seq] + len(tokens) == prompt_len,
                params=params if first else None, num_prompt_tokens=prompt_len if first else 0,
            ))  # fmt: skip
            done[seq] += len(tokens)
            budget -= len(tokens)
    return tuple(works)


def summary_lines(result: WorkloadResult) -> list[str]:
    """The timeline's phases (module doc); nothing without steps."""
    steps = result.steps
    if not steps:
        return []
    inside = sum(s.end - s.start for s in steps)
    lines = [
        f"  {len(steps)} steps; inside execute {inside:.2f} s of {result.seconds:.2f} s "
        f"({result.seconds - inside:.2f} s outside: the loop's planning)"
    ]
    prefill = [s for s in steps if s.num_prefill_seqs]
    if prefill:
        ms = [1e3 * (s.end - s.start) for s in prefill]
        span = sum(ms) / 1e3
        tokens = sum(s.num_tokens for s in prefill)
        lines.append(
            f"  steps with prefill: {len(prefill)}, {span:.2f} s, {tokens} tokens "
            f"({tokens / span / 1e3 if span > 0 else 0.0:.0f}K tok/s); the first "
            f"{ms[0]:.1f} ms, median {statistics.median(ms):.1f} ms"
        )
    decodes = [s for s in steps if not s.num_prefill_seqs]
    for lo, hi in _buckets(max((s.num_seqs for s in decodes), default=0)):
        group = [s for s in decodes if lo <= s.num_seqs <= hi]
        if group:
            ms = [1e3 * (s.end - s.start) for s in group]
            lines.append(
                f"  decode steps of {lo}-{hi} sequences: {len(group)}, {sum(ms) / 1e3:.2f} s, "
                f"median {statistics.median(ms):.2f} ms"
            )
    return lines


def _buckets(top: int) -> list[tuple[int, int]]:
    """Powers of two up to `top`: (1, 1), (2, 3), (4, 7), ..."""
    out, lo = [], 1
    while lo <= top:
        out.append((lo, min(2 * lo - 1, top)))
        lo *= 2
    return out
