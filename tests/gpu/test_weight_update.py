"""Engine.update_weights_from_disk and Engine.reset_prefix_cache on tiny random Qwen3 folders
against transformers: after an update to folder B the greedy output is B's (A's before, and
they differ), a prompt cached under A is not served after it, a checkpoint of other shapes is
refused with A still answering (its cache kept), requests in flight finish on A while those
sent meanwhile wait and run on B, abort_all_requests ends the ones in flight, and a reset drops
the cached blocks while a running request goes on as if nothing happened."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from troupe import Engine, EngineConfig
from troupe.messages import Aborted, Finished, SamplingParams, StreamEvent
from troupe.messages.engine_calls import WeightsErrorCode

from tests.gpu.conftest import add_word_tokenizer

PROMPT = [(7 * j + 3) % 256 for j in range(21)]
OTHER = [(5 * j + 1) % 256 for j in range(17)]
MAX_TOKENS = 8


@pytest.fixture
def folders(tmp_path: Path, mt: SimpleNamespace) -> dict[str, tuple[Path, Any]]:
    """Qwen3 checkpoints A and B (same shapes, other weights) and C (another width)."""
    made = {}
    for name, kwargs in {
        "a": {"seed": 0},
        "b": {"seed": 1},
        "c": {"seed": 2, "hidden_size": 32},
    }.items():
        hf_model = mt.make_hf_model("qwen3", **kwargs)
        folder = tmp_path / name
        hf_model.save_pretrained(folder)
        add_word_tokenizer(folder)
        made[name] = folder, hf_model
    return made


def _config(folder: Path) -> EngineConfig:
    return EngineConfig(
        device="cpu",
        model=str(folder),
        dtype="float32",
        block_size=4,
        num_kv_blocks=64,
        max_num_seqs=4,
        max_model_len=128,
    )


def _params(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _tokens(events: list[StreamEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]  # type: ignore[union-attr]


async def _run(engine: Engine, prompt: list[int], max_tokens: int = MAX_TOKENS) -> list[Any]:
    return [e async for e in engine.generate(prompt, _params(max_tokens))]


def test_update_runs_the_new_weights_and_drops_the_old_prefix(
    folders: dict[str, tuple[Path, Any]], mt: SimpleNamespace
) -> None:
    (a, hf_a), (b, hf_b) = folders["a"], folders["b"]
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with Engine.open(_config(a)) as engine:
            seen["before"] = await _run(engine, PROMPT)
            seen["cached_before"] = await _run(engine, PROMPT)  # hits A's prefix
            seen["update"] = await engine.update_weights_from_disk(str(b))
            seen["after"] = await _run(engine, PROMPT)
            seen["cached_after"] = await _run(engine, PROMPT)  # hits B's prefix

    anyio.run(main)
    want_a = mt.hf_greedy(hf_a, PROMPT, MAX_TOKENS)
    want_b = mt.hf_greedy(hf_b, PROMPT, MAX_TOKENS)
    assert want_a != want_b
    assert _tokens(seen["before"]) == _tokens(seen["cached_before"]) == want_a
    assert seen["cached_before"][-1].usage.cached_tokens == 20  # 5 full blocks of 4
    update = seen["update"]
    assert update.success, update.message
    assert "copied" in update.message and str(b) in update.message
    assert update.dropped is not None and update.dropped.num_gpu_blocks >= 5
    assert _tokens(seen["after"]) == _tokens(seen["cached_after"]) == want_b
    assert seen["after"][-1].usage.cached_tokens == 0  # A's KV is not served for B
    assert seen["cached_after"][-1].usage.cached_tokens == 20


def test_a_checkpoint_of_other_shapes_is_refused_and_a_still_answers(
    folders: dict[str, tuple[Path, Any]], mt: SimpleNamespace, tmp_path: Path
) -> None:
    (a, hf_a), (c, _) = folders["a"], folders["c"]
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with Engine.open(_config(a)) as engine:
            await _run(engine, PROMPT)
            seen["other"] = await engine.update_weights_from_disk(str(c))
            seen["missing"] = await engine.update_weights_from_disk(str(tmp_path / "nowhere"))
            seen["format"] = await engine.update_weights_from_disk(str(a), load_format="gguf")
            seen["after"] = await _run(engine, PROMPT)

    anyio.run(main)
    other, missing, fmt = seen["other"], seen["missing"], seen["format"]
    assert not other.success and other.error == WeightsErrorCode.INVALID
    assert "hidden_size: 64 != 32" in other.message and other.dropped is None
    assert not missing.success and "is not a folder" in missing.message
    assert not fmt.success and "load_format 'gguf'" in fmt.message
    assert _tokens(seen["after"]) == mt.hf_greedy(hf_a, PROMPT, MAX_TOKENS)
    assert seen["after"][-1].usage.cached_tokens == 20  # nothing changed: the cache stays


async def _first_delta(events: AsyncIterator[StreamEvent]) -> StreamEvent:
    return await events.__anext__()


def test_requests_in_flight_finish_on_the_old_weights(
    folders: dict[str, tuple[Path, Any]], mt: SimpleNamespace
) -> None:
    """r1 runs when the update is called: it ends on A; r2, sent while the update waits for
    r1, waits too and runs on B. The order of their events is the only thing relied on."""
    (a, hf_a), (b, hf_b) = folders["a"], folders["b"]
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with Engine.open(_config(a)) as engine, anyio.create_task_group() as tg:
            r1 = engine.generate(PROMPT, _params(24))
            first = await _first_delta(r1)  # r1 runs

            async def update() -> None:
                seen["update"] = await engine.update_weights_from_disk(str(b))

            tg.start_soon(update)
            await anyio.wait_all_tasks_blocked()  # the update is sent and waits for r1
            r2 = [e async for e in engine.generate(OTHER, _params())]
            seen["r1"] = [first] + [e async for e in r1]
            seen["r2"] = r2

    anyio.run(main)
    assert seen["update"].success
    assert _tokens(seen["r1"]) == mt.hf_greedy(hf_a, PROMPT, 24)
    assert _tokens(seen["r2"]) == mt.hf_greedy(hf_b, OTHER, MAX_TOKENS)


def test_abort_all_requests_ends_those_in_flight(
    folders: dict[str, tuple[Path, Any]], mt: SimpleNamespace
) -> None:
    (a, _), (b, hf_b) = folders["a"], folders["b"]
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with Engine.open(_config(a)) as engine:
            r1 = engine.generate(PROMPT, _params(100))
            await _first_delta(r1)
            seen["update"] = await engine.update_weights_from_disk(str(b), abort_all_requests=True)
            seen["r1"] = [e async for e in r1]
            seen["after"] = await _run(engine, PROMPT)

    anyio.run(main)
    assert seen["update"].success
    assert isinstance(seen["r1"][-1], Aborted)
    assert _tokens(seen["after"]) == mt.hf_greedy(hf_b, PROMPT, MAX_TOKENS)


def test_reset_prefix_cache_drops_cached_blocks_and_running_requests_go_on(
    folders: dict[str, tuple[Path, Any]], mt: SimpleNamespace
) -> None:
    """Counts are exact: a reset rides the batch that frees the request before it. A block a
    running request holds keeps its entry (the request reads it): served again after."""
    (a, hf_a) = folders["a"]
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with Engine.open(_config(a)) as engine:
            await _run(engine, OTHER)  # 24 tokens computed: 6 full blocks, cached once freed
            seen["first"] = await engine.reset_prefix_cache()
            seen["other"] = await _run(engine, OTHER)  # recomputed
            seen["second"] = await engine.reset_prefix_cache()
            r1 = engine.generate(PROMPT, _params(24))
            first = await _first_delta(r1)  # r1 holds its blocks, none is cached and free
            seen["running"] = await engine.reset_prefix_cache()
            seen["r1"] = [first] + [e async for e in r1]
            seen["again"] = await _run(engine, PROMPT)

    anyio.run(main)
    assert seen["first"].dropped.num_gpu_blocks == 6
    assert seen["first"].dropped.num_cpu_blocks == 0
    assert seen["other"][-1].usage.cached_tokens == 0
    assert _tokens(seen["other"]) == mt.hf_greedy(hf_a, OTHER, MAX_TOKENS)
    assert seen["second"].dropped.num_gpu_blocks == 6
    assert seen["running"].dropped.num_gpu_blocks == 0
    assert isinstance(seen["r1"][-1], Finished)
    assert _tokens(seen["r1"]) == mt.hf_greedy(hf_a, PROMPT, 24)
    assert seen["again"][-1].usage.cached_tokens == 20  # r1's blocks kept their entries
    assert _tokens(seen["again"]) == mt.hf_greedy(hf_a, PROMPT, MAX_TOKENS)
