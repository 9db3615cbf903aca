"""Beam search (actors/beam_search.py) over the engine on a tiny random Qwen3, against the
same search done on transformers' logits: the same beams, the same cumulative logprobs, the
same order; EOS ends a beam; max_model_len ends one too; bad widths are refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from troupe import Engine, EngineConfig
from troupe.actors.beam_search import Beam, BeamSearchParams, beam_search
from troupe.messages import ParamError

from tests.gpu.conftest import add_word_tokenizer

PROMPT = [17, 3, 99, 250, 41, 8, 77]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    from tests.gpu.conftest import make_hf_model

    hf_model = make_hf_model("qwen3", max_position_embeddings=128, std=0.5)
    folder = tmp_path_factory.mktemp("beam") / "model"
    hf_model.save_pretrained(folder)
    add_word_tokenizer(folder)
    return folder, hf_model


def _reference(
    hf_model: Any, prompt: list[int], width: int, max_tokens: int, eos: set[int], penalty: float
) -> list[tuple[tuple[int, ...], float]]:
    """The search the module describes, on full-sequence forwards (fp32)."""

    def rank(item: tuple[tuple[int, ...], float, bool]) -> float:
        tokens, logprob, ended = item
        return logprob / (len(prompt) + len(tokens) - ended) ** penalty

    live: list[tuple[tuple[int, ...], float, bool]] = [((), 0.0, False)]
    done: list[tuple[tuple[int, ...], float, bool]] = []
    for _ in range(max_tokens):
        grown = []
        for tokens, logprob, _ended in live:
            with torch.no_grad():
                logits = hf_model(torch.tensor([prompt + list(tokens)])).logits[0, -1]
            values, ids = logits.log_softmax(-1).topk(2 * width)
            for value, token in zip(values.tolist(), ids.tolist(), strict=True):
                item = ((*tokens, token), logprob + value, token in eos)
                (done if token in eos else grown).append(item)
        live = sorted(grown, key=rank, reverse=True)[:width]
    done = sorted(done + live, key=rank, reverse=True)[:width]
    return [(tokens, logprob) for tokens, logprob, _ in done]


async def _search(config: EngineConfig, prompt: list[int], params: BeamSearchParams) -> list[Beam]:
    async with Engine.open(config) as engine:
        return await beam_search(engine, prompt, params)


def _config(folder: Path, **changes: Any) -> EngineConfig:
    base: dict[str, Any] = {
        "device": "cpu",
        "model": str(folder),
        "dtype": "float32",
        "block_size": 4,
        "num_kv_blocks": 128,
        "max_num_seqs": 8,
        "max_model_len": 64,
    }
    return EngineConfig(**{**base, **changes})


@pytest.mark.parametrize("width, penalty", [(3, 1.0), (2, 0.0)])
def test_beams_equal_the_search_on_transformers(
    tiny: tuple[Path, Any], width: int, penalty: float
) -> None:
    folder, hf_model = tiny
    params = BeamSearchParams(beam_width=width, max_tokens=6, length_penalty=penalty)
    beams = anyio.run(_search, _config(folder), PROMPT, params)
    expected = _reference(hf_model, PROMPT, width, 6, set(), penalty)  # the tiny model: no EOS
    assert [b.token_ids for b in beams] == [tokens for tokens, _ in expected]
    for beam, (_, logprob) in zip(beams, expected, strict=True):
        assert beam.cumulative_logprob == pytest.approx(logprob, abs=1e-3)
        assert beam.finish_reason == "length"
        assert beam.text == " ".join(f"w{t}" for t in beam.token_ids)
    assert len({b.token_ids for b in beams}) == width  # distinct beams


def test_eos_ends_a_beam(tiny: tuple[Path, Any]) -> None:
    folder, hf_model = tiny
    with torch.no_grad():
        logits = hf_model(torch.tensor([PROMPT])).logits[0, -1]
    eos = int(logits.argmax())  # the likeliest first token, made the EOS
    params = BeamSearchParams(beam_width=2, max_tokens=4)

    async def run() -> list[Beam]:
        async with Engine.open(_config(folder)) as engine:
            engine.eos_token_ids = (eos,)
            return await beam_search(engine, PROMPT, params)

    beams = anyio.run(run)
    expected = _reference(hf_model, PROMPT, 2, 4, {eos}, 1.0)
    assert [b.token_ids for b in beams] == [tokens for tokens, _ in expected]
    stopped = [b for b in beams if b.finish_reason == "stop"]
    assert all(b.token_ids[-1] == eos for b in stopped)
    assert stopped and len(stopped[0].token_ids) == 1  # the likeliest first token ended it


def test_max_model_len_ends_beams_and_bad_widths_are_refused(tiny: tuple[Path, Any]) -> None:
    folder, _ = tiny
    params = BeamSearchParams(beam_width=2, max_tokens=20)
    beams = anyio.run(_search, _config(folder, max_model_len=12), PROMPT, params)
    assert len(beams) == 2
    assert all(b.finish_reason == "length" and len(b.token_ids) == 12 - len(PROMPT) for b in beams)
    for width in (0, 11):
        with pytest.raises(ParamError, match=r"beam_width must be in \[1, 10\]"):
            anyio.run(_search, _config(folder), PROMPT, BeamSearchParams(beam_width=width))
