"""thinking_token_budget through the whole engine on a tiny random Qwen3 with a word tokenizer
(`w<i>` is token i), the tags two words each: a prompt that ends on the opening tag leaves
thinking open, so the answer thinks for the budget, then its next tokens are the closing tag,
then it goes on as greedy does after that text (checked against transformers); a prompt that
closed its thinking is left alone; a budget without tags is refused naming it. On the CPU,
and on CUDA (`-m gpu`: overlapped steps feed history rows from the host, CUDA graphs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, SamplingParams
from troupe.messages import Rejected

from tests.gpu.test_token_bans_engine import DEVICES, PROMPT, PROMPT_IDS, config
from tests.gpu.tiny_qwen3 import tiny_folder

pytestmark = pytest.mark.anyio
TAGS = ("w200 w201", "w210 w211")
OPEN, CLOSE = [200, 201], [210, 211]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def greedy(budget: int | None, tags: tuple[str, str] | None = TAGS) -> SamplingParams:
    return SamplingParams(
        max_tokens=10, temperature=0.0, ignore_eos=True, thinking_token_budget=budget,
        thinking_tags=tags,
    )  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
async def test_the_budget_closes_thinking(hf_folder: Any, tmp_path: Path, device: str) -> None:
    folder, hf_model = tiny_folder(hf_folder, tmp_path)
    opened = f"{PROMPT} w200 w201"
    closed = f"{opened} w210 w211"
    async with Engine.open(config(folder, device)) as engine:
        base = token_ids(await collect(engine, opened, greedy(None, None)))
        three = token_ids(await collect(engine, opened, greedy(3)))
        none = token_ids(await collect(engine, opened, greedy(0)))
        plain = token_ids(await collect(engine, closed, greedy(None, None)))
        after = token_ids(await collect(engine, closed, greedy(0)))
        untagged = terminal(await collect(engine, opened, greedy(3, None)))
        await wait_blocks_free(engine)
    assert base[:5] != [*base[:3], *CLOSE]  # greedy alone would not close it there
    assert three[:5] == [*base[:3], *CLOSE] and none[:2] == CLOSE
    assert after == plain  # the prompt closed its thinking: no budget to spend
    prompt = [*PROMPT_IDS, *OPEN]
    for out in (three, none):  # after the tag: greedy's own continuation of that text
        with torch.no_grad():
            ids = torch.tensor([prompt + out])
            logits = hf_model(ids).logits[0].float()
        start = out.index(CLOSE[1]) + 1
        for i in range(start, len(out)):
            assert out[i] == int(logits[len(prompt) + i - 1].argmax()), (out, i)
    assert isinstance(untagged, Rejected) and untagged.field == "thinking_token_budget"


async def test_speculation_keeps_the_budget(hf_folder: Any, tmp_path: Path) -> None:
    """n-gram proposals (a prompt that repeats itself, tags included, so they propose the
    tags too) are verified row by row, each row reading the output up to its own position:
    the same tokens as one at a time."""
    folder, _ = tiny_folder(hf_folder, tmp_path)
    prompt = " ".join([PROMPT, "w200 w201 w5 w210 w211"] * 2 + ["w200 w201"])
    spec = {"speculative_method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    outs = []
    for extra in ({}, spec):
        async with Engine.open(config(folder, "cpu").replace(**extra)) as engine:
            outs.append([token_ids(await collect(engine, prompt, greedy(b))) for b in (3, 0, 6)])
            stats = engine.stats()
            await wait_blocks_free(engine)
    assert outs[0] == outs[1]
    assert [out[b : b + 2] for out, b in zip(outs[0], (3, 0, 6), strict=True)] == [CLOSE] * 3
    assert stats.num_spec_proposed_tokens > 0  # proposals were made (and checked)
