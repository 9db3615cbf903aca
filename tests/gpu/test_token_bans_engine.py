"""allowed_token_ids, bad_words and truncate_prompt_tokens through the whole engine on a tiny
random Qwen3 with a word tokenizer (`w<i>` is token i): on the CPU, and on CUDA (`-m gpu`:
overlapped steps feed history rows from the host, CUDA graphs), checked against transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.messages import Finished, Rejected

from tests.gpu.tiny_qwen3 import tiny_folder

pytestmark = pytest.mark.anyio
PROMPT_IDS = [5, 17, 3, 99, 42, 7, 11]
PROMPT = " ".join(f"w{i}" for i in PROMPT_IDS)
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def config(folder: Path, device: str) -> EngineConfig:
    return EngineConfig(
        device=device,
        model=str(folder),
        dtype="float32",
        block_size=4,
        num_kv_blocks=64,
        max_num_seqs=4,
        max_model_len=64,
    )


def greedy(max_tokens: int = 10, **extra: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **extra)


@pytest.mark.parametrize("device", DEVICES)
async def test_allowed_token_ids_pick_the_best_allowed(
    hf_folder: Any, tmp_path: Path, device: str
) -> None:
    folder, hf_model = tiny_folder(hf_folder, tmp_path)
    async with Engine.open(config(folder, device)) as engine:
        base = token_ids(await collect(engine, PROMPT, greedy()))
        # the set leaves out greedy's own choices, so the mask decides every token
        allowed = [t for t in (9, 40, 77, 150, 201, 250) if t not in base][:4]
        out = token_ids(await collect(engine, PROMPT, greedy(allowed_token_ids=tuple(allowed))))
        seeded = SamplingParams(max_tokens=10, seed=3, allowed_token_ids=tuple(allowed))
        drawn = token_ids(await collect(engine, PROMPT, seeded))
        await wait_blocks_free(engine)
    assert len(out) == 10 and set(out) <= set(allowed) and set(drawn) <= set(allowed)
    with torch.no_grad():
        logits = hf_model(torch.tensor([PROMPT_IDS + out])).logits[0].float()
    for i, token in enumerate(out):
        row = logits[len(PROMPT_IDS) + i - 1, allowed]
        assert token == allowed[int(row.argmax())], i


@pytest.mark.parametrize("device", DEVICES)
async def test_bad_words_skip_a_word_greedy_would_write(
    hf_folder: Any, tmp_path: Path, device: str
) -> None:
    folder, _ = tiny_folder(hf_folder, tmp_path)
    async with Engine.open(config(folder, device)) as engine:
        base = token_ids(await collect(engine, PROMPT, greedy()))
        k = next(i for i in range(2, 9) if base[i] not in base[:i])  # first use of a token
        one = token_ids(await collect(engine, PROMPT, greedy(bad_words=(f"w{base[k]}",))))
        # two tokens: the first is still written, the second is not after it
        pair = f" w{base[k - 1]} w{base[k]}"
        two = token_ids(await collect(engine, PROMPT, greedy(bad_words=(pair,))))
        await wait_blocks_free(engine)
    assert one[:k] == base[:k] and base[k] not in one
    assert two[:k] == base[:k] and two[k] != base[k]
    assert all(two[i : i + 2] != [base[k - 1], base[k]] for i in range(len(two) - 1))


async def test_truncate_prompt_tokens_runs_the_prompt_tail(hf_folder: Any, tmp_path: Path) -> None:
    folder, _ = tiny_folder(hf_folder, tmp_path)
    async with Engine.open(config(folder, "cpu")) as engine:
        tail = " ".join(PROMPT.split()[-3:])
        whole = await collect(engine, tail, greedy(6))
        cut = await collect(engine, PROMPT, greedy(6, truncate_prompt_tokens=3))
        ids = await collect(engine, PROMPT_IDS, greedy(6, truncate_prompt_tokens=3))
        too_many = await collect(engine, PROMPT, greedy(6, truncate_prompt_tokens=65))
        await wait_blocks_free(engine)
    assert token_ids(cut) == token_ids(ids) == token_ids(whole) and len(token_ids(whole)) == 6
    for events in (cut, ids):
        end = terminal(events)
        assert isinstance(end, Finished) and end.usage.prompt_tokens == 3
    end = terminal(too_many)
    assert isinstance(end, Rejected) and end.field == "truncate_prompt_tokens"
    assert "max_model_len (64)" in end.message
