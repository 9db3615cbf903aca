"""The scheduler with prompts that hold images whose rows attend to each other (Gemma 3:
StepLimits.image_rows): no prefill chunk ends inside an image, each chunk carries the images
it overlaps, and in a pool too small for everyone requests are preempted (a chunk that would
end inside an image takes its blocks by preempting others) and all finish with the fake
runner's reference tokens; every block comes back."""

from __future__ import annotations

import hashlib

import pytest
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.step_limits import StepLimits
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import AdmittedRequest, PromptImage, SampledToken, SamplingParams, StepPlan
from troupe.messages.samples import SAMPLE_SEP, sample_id
from troupe.ops.bench_scheduler import CoreLoop

from tests.actors.core.allocator_invariants import check_allocator

ROWS = 6  # an image's rows
BS = 4


class ChunkWatcher:
    """A FakeRunner that checks each prefill chunk against the images of its request."""

    def __init__(self, runner: FakeRunner, images: dict[str, tuple[PromptImage, ...]]) -> None:
        self.runner, self.images = runner, images
        self.num_chunks = 0

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        for work in plan.seqs:
            start, end = work.start_pos, work.start_pos + work.num_tokens
            parent = work.request_id.split(SAMPLE_SEP)[0]  # n > 1: a sample's are its parent's
            images = self.images.get(parent, ())
            for image in images:
                assert not image.start < end < image.stop, (work.request_id, start, end, image)
            want = tuple(i for i in images if i.overlaps(start, end))
            assert work.images == want, (work.request_id, start, end)
            self.num_chunks += bool(want)
        return self.runner.execute(plan)


def _image(start: int, seed: int) -> PromptImage:
    digest = hashlib.blake2b(str(seed).encode(), digest_size=16).hexdigest()  # as a pixel hash
    return PromptImage(b"\0" * 12, 1, 1, start, ROWS, digest)


# (prompt length, tokens out, image starts)
REQUESTS = [(20, 9, (3, 11)), (17, 12, (2,)), (25, 6, (1, 9, 16)), (12, 10, (5,))]


def _run(
    mode: str,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    budget: int,
    n: int = 1,
    caching: bool = True,
    shapes: list[tuple[int, int, tuple[int, ...]]] = REQUESTS,
) -> CoreLoop:
    limits = StepLimits(
        block_size=BS, num_gpu_blocks=num_gpu_blocks, max_num_seqs=8,
        max_num_batched_tokens=budget, image_rows=ROWS, enable_prefix_caching=caching,
    )  # fmt: skip
    scheduler = SchedulerCore(
        limits, num_cpu_blocks=num_cpu_blocks, preemption_mode=mode, eos_token_ids=(2,)
    )
    allocator = AllocatorCore(
        block_size=BS, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
        enable_prefix_caching=caching,
    )  # fmt: skip
    runner = FakeRunner(
        block_size=BS, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
        max_model_len=4096,
    )  # fmt: skip
    requests = [
        AdmittedRequest(
            request_id=f"r{i}",
            prompt_token_ids=tuple(100 + (i * 37 + j * 11) % 900 for j in range(prompt)),
            params=SamplingParams(max_tokens=out, ignore_eos=True, n=n),
            arrival_time=0.0,
            max_total_tokens=prompt + out,
            images=tuple(_image(s, 16 * i + k) for k, s in enumerate(starts)),
        )
        for i, (prompt, out, starts) in enumerate(shapes)
    ]
    watcher = ChunkWatcher(runner, {r.request_id: r.images for r in requests})
    loop = CoreLoop(scheduler, allocator, watcher, check=check_allocator)  # type: ignore[arg-type]
    loop.submit(requests)
    loop.run()
    assert watcher.num_chunks > 0
    for req in requests:
        want = FakeRunner.reference_tokens(req.prompt_token_ids, req.params.max_tokens)
        ids = [req.request_id] if n == 1 else [sample_id(req.request_id, k) for k in range(n)]
        for rid in ids:
            assert loop.tokens[rid] == want, rid
    return loop


@pytest.mark.parametrize("budget", [ROWS, 7, 10, 64])
def test_chunks_hold_whole_images(budget: int) -> None:
    loop = _run("recompute", num_gpu_blocks=256, num_cpu_blocks=0, budget=budget)
    stats = loop.batches[-1].stats
    assert stats is not None and stats.num_gpu_blocks_used == 0


@pytest.mark.parametrize(("mode", "num_cpu_blocks"), [("recompute", 0), ("swap", 64)])
@pytest.mark.parametrize("budget", [9, 16, 24])
def test_preempted_in_a_tiny_pool(mode: str, num_cpu_blocks: int, budget: int) -> None:
    loop = _run(mode, num_gpu_blocks=10, num_cpu_blocks=num_cpu_blocks, budget=budget)
    stats = loop.batches[-1].stats
    assert stats is not None and stats.num_gpu_blocks_used == stats.num_cpu_blocks_used == 0
    assert stats.num_preemptions_swap + stats.num_preemptions_recompute > 0, stats


def test_samples_recomputed_with_their_images() -> None:
    """n = 2: each sample forks after its parent's prompt; preempted and recomputed, a sample
    feeds its prompt's images again (a fork keeps them; no prefix cache to skip them)."""
    shapes = [(12, 20, (2,)), (13, 18, (3,))]
    loop = _run("recompute", 12, 0, 16, n=2, caching=False, shapes=shapes)
    stats = loop.batches[-1].stats
    assert stats is not None and stats.num_preemptions_recompute > 0, stats
