"""What a prefill chunk costs the decodes beside it (GPU): mixed-step CUDA graphs against eager.

    python -m troupe.ops.mixed_step_bench [--num-seqs 256] [--context 512]

Qwen3-0.6B shape, random bf16 weights. Every sequence is prefilled to `context` tokens, then
steps are timed (wall time of ModelRunner.execute and a device sync, so all GPU work is in;
overlap off, so each step stands alone):

    decode      the num_seqs decodes alone
    chunk C     a C-token prompt chunk alone (a fresh request per step)
    mixed C     the decodes and the chunk in one step, decodes first (as the scheduler builds it)

for a runner with mixed-step graphs (gpu/mixed_graphs.py) and one where such steps run eagerly
(pure decode steps replay graphs in both). The chunk's extra cost on the decodes is
mixed C - decode; with graphs it should approach chunk C's own GPU time.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.weights import build_model, qwen3_0_6b_config, random_weights
from troupe.messages import SamplingParams, SeqWork, StepPlan

CHUNKS = (256, 512, 1024, 2048, 3840)
BLOCK = 16


class Driver:
    """Hand-built plans: prefill num_seqs sequences, then decodes and fresh prompt chunks."""

    def __init__(self, runner: ModelRunner, num_seqs: int, context: int) -> None:
        self.runner = runner
        self.params = SamplingParams(temperature=0.6, max_tokens=10_000, ignore_eos=True)
        self.free = list(range(runner.num_gpu_blocks))
        self.pos = {f"r{i}": 0 for i in range(num_seqs)}
        self.last: dict[str, int] = {}
        self.step_id = 0
        self.fresh = 0
        for i in range(0, num_seqs, 8):  # 8 x context tokens per step
            ids = [f"r{j}" for j in range(i, min(i + 8, num_seqs))]
            self.run([self._prefill(rid, context) for rid in ids])

    def _blocks(self, start: int, end: int) -> tuple[int, ...]:
        count = -(-end // BLOCK) - -(-start // BLOCK)
        taken, self.free = self.free[:count], self.free[count:]
        return tuple(taken)

    def _prefill(self, rid: str, length: int, sample: bool = True) -> SeqWork:
        self.pos[rid] = length
        return SeqWork(
            request_id=rid,
            token_ids=tuple((7 * k + len(rid)) % 1000 for k in range(length)),
            start_pos=0,
            block_ids=self._blocks(0, length),
            reset=True,
            sample=sample,
            params=self.params,
            num_prompt_tokens=length + (0 if sample else 1),
        )

    def decodes(self) -> list[SeqWork]:
        works = []
        for rid, token in self.last.items():
            pos = self.pos[rid]
            works.append(
                SeqWork(
                    request_id=rid,
                    token_ids=(token,),
                    start_pos=pos,
                    block_ids=self._blocks(pos, pos + 1),
                    reset=False,
                )
            )
            self.pos[rid] = pos + 1
        return works

    def chunk(self, size: int) -> tuple[SeqWork, str]:
        """A fresh request's first chunk (its prompt is one token longer: nothing sampled)."""
        self.fresh += 1
        rid = f"p{self.fresh}"
        return self._prefill(rid, size, sample=False), rid

    def run(self, works: list[SeqWork], released: tuple[str, ...] = ()) -> float:
        self.step_id += 1
        plan = StepPlan(step_id=self.step_id, seqs=tuple(works), released=released)
        start = time.perf_counter()
        out = self.runner.execute(plan)
        torch.cuda.synchronize()  # a step that samples nothing returns before its GPU work ends
        seconds = time.perf_counter() - start
        for token in out:
            if token.request_id.startswith("r"):
                self.last[token.request_id] = token.token_id
        return seconds


def median_ms(step: Callable[[], float], repeat: int) -> float:
    step()  # warm-up
    return 1000 * statistics.median(step() for _ in range(repeat))


def measure(
    runner: ModelRunner, num_seqs: int, context: int, repeat: int, profile: int
) -> dict[str, float]:
    driver = Driver(runner, num_seqs, context)
    pending: list[str] = []  # chunk requests to release (and their blocks to reuse)

    def step(with_decodes: bool, size: int) -> float:
        works = driver.decodes() if with_decodes else []
        if size:
            work, rid = driver.chunk(size)
            works.append(work)
            pending.append(rid)
        # earlier chunks' requests end here (their blocks are not reused: the pool is big)
        released = tuple(pending[:-1]) if size else tuple(pending)
        del pending[: len(released)]
        return driver.run(works, released)

    result = {"decode": median_ms(lambda: step(True, 0), repeat)}
    for size in CHUNKS:
        result[f"chunk {size}"] = median_ms(functools.partial(step, False, size), repeat)
        result[f"mixed {size}"] = median_ms(functools.partial(step, True, size), repeat)
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        step(True, profile)
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step(True, profile)
        table = prof.key_averages().table(
            sort_by="self_device_time_total", row_limit=14, max_name_column_width=70
        )
        print(f"3 mixed steps of {num_seqs} decodes + a {profile}-token chunk:\n{table}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--profile", type=int, default=0, help="chunk size to profile (0: none)")
    args = parser.parse_args()
    config = qwen3_0_6b_config()
    device = torch.device("cuda")
    weights = random_weights(config, torch.bfloat16, seed=0)
    max_tokens = max(CHUNKS)
    steps = 1 + (1 + len(CHUNKS) * 2) * (args.repeat + 1)
    per_seq = -(-(args.context + steps + 1) // BLOCK)
    chunk_blocks = sum(-(-c // BLOCK) for c in CHUNKS) * (args.repeat + 1) * 2
    chunk_blocks += 8 * -(-args.profile // BLOCK)  # the profiled steps' chunks
    results = {}
    for label, mixed_tokens in (("mixed graphs", max_tokens), ("mixed eager", 0)):
        model = build_model(config, weights.items(), torch.bfloat16, device, 4096)
        runner = ModelRunner(
            config,
            model,
            RunnerOptions(
                block_size=BLOCK,
                num_gpu_blocks=args.num_seqs * per_seq + chunk_blocks,
                max_num_seqs=args.num_seqs + 1,
                max_model_len=4096,
                enforce_eager=False,
                mixed_graph_tokens=mixed_tokens,
            ),
        )
        print(label, flush=True)
        results[label] = measure(runner, args.num_seqs, args.context, args.repeat, args.profile)
        runner.close()
        del runner, model
        torch.cuda.empty_cache()
    print(f"{args.num_seqs} decodes at context ~{args.context}; ms per step (median)")
    print(f"{'step':<14}" + "".join(f"{label:>16}" for label in results))
    for key in results["mixed graphs"]:
        print(f"{key:<14}" + "".join(f"{r[key]:>16.2f}" for r in results.values()))


if __name__ == "__main__":
    main()
