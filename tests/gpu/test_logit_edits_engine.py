"""logit_bias and min_tokens through the whole engine on CUDA (a tiny random Qwen3):
overlap scheduling (the next step's edits are built from the states the overlapped launch advanced) and CUDA
graphs keep them exact. `-m gpu`; the CPU path is tests/gateway/test_openai_extras_model.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.messages import Finished, FinishReason

from tests.gpu.conftest import add_word_tokenizer

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]
PROMPT = "w5 w17 w3 w99 w42 w7 w11"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def model_folder(hf_folder: Any) -> Path:
    folder, _ = hf_folder("qwen3", max_position_embeddings=512)
    add_word_tokenizer(Path(folder))
    return Path(folder)


async def test_edits_hold_under_overlap_and_graphs(model_folder: Path) -> None:
    config = EngineConfig(
        device="cuda",
        model=str(model_folder),
        max_model_len=512,
        num_kv_blocks=256,
        max_num_seqs=8,
    )
    async with Engine.open(config) as engine:
        base = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        greedy = token_ids(await collect(engine, PROMPT, base))
        assert len(greedy) == 12

        forced = SamplingParams(
            max_tokens=12, temperature=0.0, ignore_eos=True, logit_bias={greedy[3]: 100.0}
        )
        assert token_ids(await collect(engine, PROMPT, forced)) == [greedy[3]] * 12
        seeded = SamplingParams(
            max_tokens=12, temperature=1.0, ignore_eos=True, seed=5, logit_bias={7: 100.0}
        )
        assert token_ids(await collect(engine, PROMPT, seeded)) == [7] * 12

        # greedy[5] is a stop token: it ends the request at position 5 unless min_tokens
        # bans it there (the later tokens then differ from greedy's)
        stop = SamplingParams(
            max_tokens=12, temperature=0.0, ignore_eos=True, stop_token_ids=(greedy[5],)
        )
        stopped = await collect(engine, PROMPT, stop)
        assert token_ids(stopped) == greedy[: greedy.index(greedy[5]) + 1]
        held = SamplingParams(
            max_tokens=12,
            temperature=0.0,
            ignore_eos=True,
            stop_token_ids=(greedy[5],),
            min_tokens=8,
        )
        events = await collect(engine, PROMPT, held)
        ids = token_ids(events)
        assert len(ids) >= 8 and greedy[5] not in ids[:8]
        assert ids[:5] == greedy[:5] or greedy[5] in greedy[:5]
        end = terminal(events)
        assert isinstance(end, Finished)
        assert end.finish_reason == FinishReason.LENGTH or ids[-1] == greedy[5]
        await wait_blocks_free(engine)
