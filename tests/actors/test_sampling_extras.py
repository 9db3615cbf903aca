"""min_tokens and logit_bias through the Python API and the whole graph (fake runner)."""

from __future__ import annotations

import pytest
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.gpu.fake_runner import EOS_SEED_BASE, FakeRunner
from troupe.messages import Finished, FinishReason, Rejected

pytestmark = pytest.mark.anyio
PROMPT = [101, 202, 303, 404, 505]


def fake_config(**kw: object) -> EngineConfig:
    base: dict[str, object] = {"runner": "fake", "num_kv_blocks": 256, "num_cpu_blocks": 16}
    return EngineConfig(**{**base, **kw})  # type: ignore[arg-type]


async def test_min_tokens_holds_eos_and_stop_ids_back() -> None:
    """The fake's 2nd token is EOS under this seed: without min_tokens it ends the request,
    with min_tokens=4 the request runs to max_tokens on the tokens reference_tokens gives."""
    seed = EOS_SEED_BASE + 2
    async with Engine.open(fake_config()) as engine:
        plain = SamplingParams(max_tokens=6, seed=seed)
        early = await collect(engine, PROMPT, plain)
        end = terminal(early)
        assert isinstance(end, Finished) and end.finish_reason == FinishReason.STOP
        assert token_ids(early) == FakeRunner.reference_tokens(PROMPT, 2, plain)
        assert token_ids(early)[1] == 2  # EOS
        held_params = SamplingParams(max_tokens=6, seed=seed, min_tokens=4)
        held = await collect(engine, PROMPT, held_params)
        end = terminal(held)
        assert isinstance(end, Finished) and end.finish_reason == FinishReason.LENGTH
        expected = FakeRunner.reference_tokens(PROMPT, 6, held_params)
        assert token_ids(held) == expected and 2 not in expected
        # a stop token id the fake model draws is held back too, then ends the request
        first = expected[0]
        stop_params = SamplingParams(max_tokens=6, seed=seed, stop_token_ids=(first,))
        assert token_ids(await collect(engine, PROMPT, stop_params)) == [first]
        held_stop = SamplingParams(max_tokens=6, seed=seed, stop_token_ids=(first,), min_tokens=1)
        assert token_ids(await collect(engine, PROMPT, held_stop))[0] != first
        await wait_blocks_free(engine)


async def test_bad_extras_are_rejected_naming_the_field() -> None:
    async with Engine.open(fake_config()) as engine:
        for params, field in (
            (SamplingParams(logit_bias={10**7: 1.0}), "logit_bias"),  # past the vocabulary
            (SamplingParams(logit_bias={5: float("nan")}), "logit_bias"),
            (SamplingParams(max_tokens=3, min_tokens=4), "min_tokens"),
        ):
            end = terminal(await collect(engine, PROMPT, params))
            assert isinstance(end, Rejected) and end.field == field, end
