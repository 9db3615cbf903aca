"""Penalties read a request's whole history, including prompt tokens its executor never
computed: those a prefix-cache hit served, and for parallel samples those their parent did.
The same penalized request gives the same tokens with the prefix cache on (after a hit) as
off, and each of n samples the same as that sample alone."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from graph_helpers import collect, token_ids
from troupe import Engine
from troupe.messages import SamplingParams

from tests.actors.test_disaggregation_engine import LONG, _config, model  # noqa: F401

pytestmark = pytest.mark.anyio

PENALIZED = SamplingParams(max_tokens=8, temperature=0.0, repetition_penalty=3.0, ignore_eos=True)
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


async def _penalized(folder: Path, *, caching: bool) -> tuple[list[int], int]:
    async with Engine.open(_config(folder, enable_prefix_caching=caching)) as engine:
        # caches LONG's blocks; the answer is what the model likes, so a penalty on the
        # prompt's tokens (or on zeros in their place) changes what it picks
        answer = token_ids(await collect(engine, LONG, GREEDY))
        got = token_ids(await collect(engine, [*LONG, *answer], PENALIZED))
        return got, engine.stats().prefix_cache_hit_tokens


async def test_penalties_see_the_prefix_cache_hits_tokens(model: Path) -> None:  # noqa: F811
    cached, hits = await _penalized(model, caching=True)
    plain, no_hits = await _penalized(model, caching=False)
    assert hits >= 16 and no_hits == 0  # the second prompt hit LONG's blocks
    assert cached == plain


async def test_each_penalized_sample_sees_its_parents_prompt(model: Path) -> None:  # noqa: F811
    seeded = SamplingParams(
        max_tokens=6, temperature=0.9, seed=5, repetition_penalty=3.0, ignore_eos=True
    )
    async with Engine.open(_config(model, enable_prefix_caching=False)) as engine:
        prompt = [*LONG, *token_ids(await collect(engine, LONG, GREEDY))]
        alone = token_ids(await collect(engine, prompt, seeded))
        events = await collect(engine, prompt, msgspec.structs.replace(seeded, n=2))
    first = [t for e in events if e.index == 0 for t in e.token_ids]
    assert first == alone  # sample 0 draws with the request's own seed
