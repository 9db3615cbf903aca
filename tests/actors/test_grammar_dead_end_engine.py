"""A grammar that dead-ends after a free part, through the whole engine (fake runner, the
default model's tokenizer): its request ends with one Failed whose cause is the client's
grammar, having streamed only what the grammar allowed; the requests beside it finish; every
block comes back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from graph_helpers import collect_all, terminal, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.messages import Failed, FailureCause, Finished, StructuredOutputs

pytestmark = pytest.mark.anyio
CONFIG = EngineConfig(runner="fake", num_kv_blocks=64, max_num_seqs=8, gc_freeze=False)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[Engine]:
    async with Engine.open(CONFIG) as eng:
        yield eng


async def test_dead_end_fails_alone_with_its_cause(engine: Engine) -> None:
    specs = {
        "dead": StructuredOutputs(regex="[ab]\\x04"),
        "digits": StructuredOutputs(regex="[0-9]{3}"),
        "free": None,
    }
    jobs = [
        (
            f"{name}: write it",
            SamplingParams(max_tokens=8, temperature=0.0, structured_outputs=spec),
        )
        for name, spec in specs.items()
    ]
    events = dict(zip(specs, await collect_all(engine, jobs), strict=True))
    dead = terminal(events["dead"])
    assert isinstance(dead, Failed) and dead.cause is FailureCause.GRAMMAR_DEAD_END
    assert dead.message.startswith("its grammar cannot be continued after the text so far")
    assert dead.message.endswith(
        "next it allows only byte 0x04, and no token of this model's vocabulary writes what "
        "it allows"
    )
    assert "".join(e.text for e in events["dead"]) in ("a", "b")  # nothing the grammar refused
    digits = terminal(events["digits"])
    assert isinstance(digits, Finished) and digits.finish_reason == "stop"
    assert len("".join(e.text for e in events["digits"])) == 3
    assert isinstance(terminal(events["free"]), Finished)
    await wait_blocks_free(engine)
