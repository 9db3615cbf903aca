"""NaN logits on the real runner path: ModelRunner's logits_hook poisons one request's logits
from its k-th sampled row on; the sampler's check withholds its token, the engine fails that
request alone ("non-finite logits at step N"), the others finish with the tokens of a run
without the fault, every block returns and the engine stays healthy.

On the CPU with and without overlap (forced on, as a config never does there) and with penalty
state (the overlapped step then waits for host tokens); on CUDA (-m gpu) with CUDA graphs,
overlap on (as the engine runs there) and off.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig
from troupe.gpu.faulty_runner import FaultyRunner
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.weights import load_model
from troupe.messages import Failed, Finished, SamplingParams

from tests.gpu.conftest import add_word_tokenizer

PROMPTS = {
    "a": [(7 * j + 3) % 256 for j in range(5)],
    "b": [(11 * j + 1) % 256 for j in range(7)],
    "c": [(13 * j + 5) % 256 for j in range(8)],
}
NUM_TOKENS = 8
GREEDY = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
PENALTIES = SamplingParams(
    max_tokens=NUM_TOKENS,
    temperature=0.8,
    seed=11,
    repetition_penalty=1.2,
    frequency_penalty=0.3,
    ignore_eos=True,
)


class PoisonRequest:
    """A logits hook: one entry of `request_id`'s row becomes NaN from its `at`-th sampled row
    on (every later one too, so an overlapped step that is discarded cannot lose the fault)."""

    def __init__(self, request_id: str, at: int) -> None:
        self.request_id = request_id
        self.at = at
        self.num_seen = 0
        self.num_poisoned = 0

    def __call__(self, request_ids: Sequence[str], logits: torch.Tensor) -> None:
        if self.request_id not in request_ids:
            return
        self.num_seen += 1
        if self.num_seen >= self.at:
            logits[list(request_ids).index(self.request_id), 5] = float("nan")
            self.num_poisoned += 1


@pytest.fixture
def model_folder(hf_folder: Any) -> Path:
    """A tiny random Qwen3 (tests/gpu/conftest.py) with a word-level tokenizer, so an engine
    can load it."""
    folder, _ = hf_folder("qwen3", max_position_embeddings=128)
    add_word_tokenizer(Path(folder))
    return Path(folder)


def build_runner(
    folder: Path, device: str, *, overlap: bool, hook: PoisonRequest | None
) -> FaultyRunner:
    """The real runner, wrapped only to hold step 1 until every request is in (so both runs
    batch alike); the fault itself is in the logits."""
    config, model = load_model(folder, torch.float32, torch.device(device), 128)
    options = RunnerOptions(
        block_size=4,
        num_gpu_blocks=48,
        num_cpu_blocks=8,
        max_num_seqs=4,
        max_model_len=128,
        overlap_schedule=overlap,
        enforce_eager=device == "cpu",
    )
    return FaultyRunner(ModelRunner(config, model, options, logits_hook=hook))


async def run_engine(
    folder: Path, runner: FaultyRunner, device: str, params: SamplingParams
) -> dict[str, list[Any]]:
    config = EngineConfig(device=device, model=str(folder), max_model_len=128, max_num_seqs=4)
    results: dict[str, list[Any]] = {}
    async with Engine.open(config, runner=runner) as engine:
        runner.hold_after(0)

        async def one(rid: str) -> None:
            results[rid] = await collect(engine, PROMPTS[rid], params, request_id=rid)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "a")
            await anyio.to_thread.run_sync(runner.wait_until_held)
            tg.start_soon(one, "b")
            tg.start_soon(one, "c")
            while engine.num_active < 3:
                await anyio.sleep(0.01)
            runner.release()
        await wait_blocks_free(engine, timeout=60)
        stats = engine.stats()
        assert stats.num_gpu_blocks_used == 0 and stats.num_cpu_blocks_used == 0
        late = await collect(engine, PROMPTS["b"], GREEDY)  # still serving
        assert isinstance(terminal(late), Finished)
        assert engine.is_healthy
    return results


def check_nan_fails_one_request(
    folder: Path, device: str, *, overlap: bool, params: SamplingParams, at: int
) -> None:
    clean = anyio.run(
        run_engine, folder, build_runner(folder, device, overlap=overlap, hook=None), device, params
    )
    hook = PoisonRequest("a", at=at)
    runner = build_runner(folder, device, overlap=overlap, hook=hook)
    faulty = anyio.run(run_engine, folder, runner, device, params)
    assert hook.num_poisoned >= 1
    if overlap:  # the fault met the overlapped steps, not only plain ones
        assert runner.statistics().num_overlap_hits >= 3
    event = terminal(faulty["a"])
    assert isinstance(event, Failed), event
    assert event.message.startswith("non-finite logits at step "), event.message
    clean_a = token_ids(clean["a"])
    got_a = token_ids(faulty["a"])
    assert len(got_a) <= at - 1 and got_a == clean_a[: len(got_a)]  # none from a NaN row
    for rid in ("b", "c"):
        assert isinstance(terminal(faulty[rid]), Finished)
        assert token_ids(faulty[rid]) == token_ids(clean[rid])
        assert len(token_ids(clean[rid])) == NUM_TOKENS
    assert len({tuple(token_ids(clean[r])) for r in PROMPTS}) == 3  # not a degenerate model


# Where the fault lands, by a's sampled rows (step 1 holds a alone; b and c join in step 2),
# as seen on the CPU (an instrumented run):
#   plain, at 3:                 step 3, a plain step
#   overlap-miss, at 3:          step 2, plain: the step launched early for a alone missed plan 2
#   overlap-hit, at 5:           step 4, launched early (step 3 was not: b and c had no lookahead
#                                block yet) and read back when plan 4 matched, after step 5 was
#                                launched fed its device ids
#   overlap-hit-penalties, at 5: the same, but the launch of step 5 waits for host tokens, and
#                                a's has none: it is not launched
CASES = [
    pytest.param(False, GREEDY, 3, id="plain"),
    pytest.param(True, GREEDY, 3, id="overlap-miss"),
    pytest.param(True, GREEDY, 5, id="overlap-hit"),
    pytest.param(True, PENALTIES, 5, id="overlap-hit-penalties"),
]


@pytest.mark.parametrize(("overlap", "params", "at"), CASES)
def test_nan_logits_fail_one_request_on_cpu(
    model_folder: Path, overlap: bool, params: SamplingParams, at: int
) -> None:
    check_nan_fails_one_request(model_folder, "cpu", overlap=overlap, params=params, at=at)


@pytest.mark.gpu
@pytest.mark.parametrize(("overlap", "params", "at"), CASES)
def test_nan_logits_fail_one_request_on_cuda(
    model_folder: Path, overlap: bool, params: SamplingParams, at: int
) -> None:
    check_nan_fails_one_request(model_folder, "cuda", overlap=overlap, params=params, at=at)
