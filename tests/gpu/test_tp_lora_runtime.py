"""Run-time LoRA loads under tensor parallelism (gpu/tp_lora_runtime.py): through the engine
at tensor_parallel_size=2 with enable_lora, an adapter loaded while the engine runs generates
PEFT's greedy tokens (beside the base model in one batch), unloads (a request naming it is
then rejected), loads again under its name, and a load that does not fit the model is refused
by name with nothing left behind; with two ranks simulated in threads, a load that fails on
one rank is undone on the other and the answer names the failing rank."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from graph_helpers import collect
from troupe import Engine, EngineConfig
from troupe.config import ConfigError
from troupe.gpu.lora_runtime import LoraRuntime
from troupe.gpu.runner import build_runner
from troupe.gpu.tp_group import TPGroup
from troupe.gpu.tp_lora_runtime import TPLoraClient, run_lora_command
from troupe.gpu.tp_protocol import LoadLora, LoraAnswer, UnloadLora
from troupe.gpu.tp_runner import TPRunner
from troupe.messages import Rejected, SamplingParams

from tests.gpu.lora_reference import MAX_TOKENS, greedy, tokens_of

PROMPTS = [[(13 * i + 5 * j + j * j) % 256 for j in range(7 + 5 * i)] for i in range(2)]


def test_load_generate_unload_reload_at_two_ranks(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path
) -> None:
    folder, hf_model, adapters = lora_setup
    expected = {f"None/{i}": greedy(hf_model, p) for i, p in enumerate(PROMPTS)}
    expected |= {f"all/{i}": greedy(adapters["all"], p) for i, p in enumerate(PROMPTS)}
    assert expected["all/0"] != expected["None/0"]  # the adapter matters
    config = EngineConfig(
        device="cpu",
        model=str(folder),
        dtype="float32",
        block_size=4,
        num_kv_blocks=96,
        max_num_seqs=8,
        max_model_len=128,
        enable_lora=True,
        max_lora_rank=8,
        tensor_parallel_size=2,
    )  # enable_lora with tensor_parallel_size > 1 was refused: no longer
    runner = build_runner(config)
    assert isinstance(runner, TPRunner) and isinstance(runner.lora, TPLoraClient)
    results: dict[str, list[int]] = {}

    async def one(engine: Engine, key: str, prompt: list[int], lora: str | None) -> None:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, lora=lora)
        results[key] = tokens_of(await collect(engine, prompt, params))

    async def main() -> None:
        async with Engine.open(config, runner=runner) as engine:
            await engine.loras.load("all", str(tmp_path / "all"))
            async with anyio.create_task_group() as tg:  # the adapter beside the base model
                for i, prompt in enumerate(PROMPTS):
                    for lora in (None, "all"):
                        tg.start_soon(one, engine, f"{lora}/{i}", prompt, lora)
            await engine.loras.unload("all")
            params = SamplingParams(max_tokens=2, lora="all")
            events = await collect(engine, PROMPTS[0], params)
            assert (
                isinstance(events[-1], Rejected) and "no adapter named 'all'" in events[-1].message
            )
            await engine.loras.load("all", str(tmp_path / "all"))  # runs as "all#2" inside
            await one(engine, "again/all", PROMPTS[1], "all")
            with pytest.raises(ConfigError, match="'bad'"):  # not a PEFT folder: every rank says
                await engine.loras.load("bad", str(tmp_path / "missing"))
            assert "bad" not in engine.loras.adapters
            await engine.loras.unload("all")
            await engine.loras.load("qv", str(tmp_path / "qv"))  # ranks still take new ones
            await one(engine, "after/None", PROMPTS[0], None)

    anyio.run(main)
    assert results.pop("again/all") == expected["all/1"]
    assert results.pop("after/None") == expected["None/0"]
    assert results == expected
    assert None not in runner.worker_exit_codes()  # closed with the engine


class _Ranks:
    """Collectives of `size` ranks run in threads (min_int, broadcast_bytes from any rank)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._barrier = threading.Barrier(size)
        self._values: list[Any] = [None] * size

    def group(self, rank: int) -> TPGroup:
        ranks = self

        class Group:
            world_size = ranks.size

            def __init__(self) -> None:
                self.rank = rank

            def min_int(self, value: int) -> int:
                return cast(int, ranks._exchange(rank, value, min))

            def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
                return cast(bytes, ranks._exchange(rank, data, lambda values: values[src]))

        return cast(TPGroup, Group())

    def _exchange(self, rank: int, value: Any, reduce: Any) -> Any:
        self._values[rank] = value
        self._barrier.wait()
        out = reduce(list(self._values))
        self._barrier.wait()
        return out


class _Adapters:
    """A rank's LoraRuntime stand-in: the names it holds; `fails` makes add raise."""

    def __init__(self, fails: bool = False) -> None:
        self.names: set[str] = set()
        self.fails = fails

    def add(self, name: str, path: str) -> None:
        if self.fails:
            raise OSError(f"{path}: no space left on device")
        self.names.add(name)

    def retire(self, name: str) -> None:
        self.names.remove(name)


def _run(ranks: list[_Adapters], command: LoadLora | UnloadLora) -> list[LoraAnswer]:
    shared = _Ranks(len(ranks))
    answers: list[LoraAnswer | None] = [None] * len(ranks)

    def rank_body(rank: int) -> None:
        lora = cast(LoraRuntime, ranks[rank])
        answers[rank] = run_lora_command(lora, shared.group(rank), command)

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in range(len(ranks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert all(answer is not None for answer in answers)
    return [answer for answer in answers if answer is not None]


def test_a_load_failing_on_one_rank_is_undone_on_every_rank() -> None:
    ranks = [_Adapters(), _Adapters(fails=True), _Adapters()]
    answers = _run(ranks, LoadLora("sql", "/adapters/sql"))
    want = LoraAnswer(
        rank=1, error_type="OSError", message="/adapters/sql: no space left on device"
    )
    assert answers == [want] * 3  # every rank agrees; rank 0's goes back
    assert [r.names for r in ranks] == [set(), set(), set()]  # nothing half-installed
    with pytest.raises(RuntimeError, match=r"rank 1 raised OSError: /adapters/sql: no space"):
        TPLoraClient(lambda command: answers[0]).add("sql", "/adapters/sql")

    ranks[1].fails = False
    assert _run(ranks, LoadLora("sql", "/adapters/sql")) == [LoraAnswer()] * 3
    assert [r.names for r in ranks] == [{"sql"}] * 3
    assert _run(ranks, UnloadLora("sql")) == [LoraAnswer()] * 3
    assert [r.names for r in ranks] == [set(), set(), set()]
    answers = _run([_Adapters(), _Adapters()], UnloadLora("nope"))  # every rank: KeyError
    assert answers[0].rank == 0 and answers[0].error_type == "KeyError"
