"""Structured output through the whole engine with the real default model (SmolLM2) on the CPU.

One engine serves every request of the module; requests go in together, so the CPU pays for
batched steps, not for one request at a time.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import pytest
from graph_helpers import by_index, collect, collect_all, terminal, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.messages import Finished, Rejected, StructuredOutputs
from troupe.ops.json_schemas import make_schemas

pytestmark = pytest.mark.anyio
CONFIG = EngineConfig(device="cpu", max_model_len=256, max_num_seqs=128, num_kv_blocks=512)
PROMPT = "One short JSON object:"


def prompt(i: int) -> str:
    """Distinct from its first token on: identical prompts are admitted one per step (each
    waits for the previous one's prefix to be cached), which would cost a step per request."""
    return f"{i}. {PROMPT}"


NUM_SCHEMAS = 14  # two of each of make_schemas' 7 shapes, each with its own bounds and names


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[Engine]:
    async with Engine.open(CONFIG) as eng:
        yield eng


def text(events: list[Any]) -> str:
    return "".join(e.text for e in events)


async def test_json_schemas_greedy_and_sampled_validate(engine: Engine) -> None:
    schemas = make_schemas(NUM_SCHEMAS)
    jobs = []
    for i, schema in enumerate(schemas):
        spec = StructuredOutputs.from_schema(schema)
        for temperature in (0.0, 1.0):
            jobs.append(
                (
                    prompt(len(jobs)),
                    SamplingParams(
                        max_tokens=32, temperature=temperature, seed=i, structured_outputs=spec
                    ),
                )
            )
    results = await collect_all(engine, jobs)
    num_stop = 0
    for (_, params), events in zip(jobs, results, strict=True):
        end = terminal(events)
        assert isinstance(end, Finished), end
        if end.finish_reason == "stop":
            num_stop += 1
            schema = json.loads(params.structured_outputs.json)  # type: ignore[union-attr]
            jsonschema.validate(json.loads(text(events)), schema)
        else:
            assert end.finish_reason == "length"
    assert num_stop >= 0.75 * len(jobs), f"only {num_stop} of {len(jobs)} finished"
    await wait_blocks_free(engine)


async def test_regex_choice_grammar_and_json_object(engine: Engine) -> None:
    regex = r"[0-9]{3}-[a-z]{2,4}"
    choices = ("alpha", "beta", 'say "gamma"')
    grammar = 'root ::= "(" num ("+" num)? ")"\nnum ::= [1-9] [0-9]?'
    specs = [
        StructuredOutputs(regex=regex),
        StructuredOutputs(choice=choices),
        StructuredOutputs(grammar=grammar),
        StructuredOutputs(json_object=True),
    ]
    jobs = [
        (prompt(i), SamplingParams(max_tokens=24, temperature=t, seed=i, structured_outputs=spec))
        for i, (spec, t) in enumerate((s, t) for s in specs for t in (0.0, 1.0, 1.0))
    ]
    results = await collect_all(engine, jobs)
    outputs = [(terminal(ev), text(ev)) for ev in results]
    for end, out in outputs[0:3]:
        assert end.finish_reason == "stop" and re.fullmatch(regex, out), out
    for end, out in outputs[3:6]:
        assert end.finish_reason == "stop" and out in choices, out
    for end, out in outputs[6:9]:
        assert end.finish_reason == "stop" and re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?)?\)", out)
    for end, out in outputs[9:12]:
        if end.finish_reason == "stop":
            assert isinstance(json.loads(out), dict), out


async def test_truncated_json_says_length(engine: Engine) -> None:
    spec = StructuredOutputs.from_schema(
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    )
    events = await collect(
        engine, PROMPT, SamplingParams(max_tokens=3, temperature=0.0, structured_outputs=spec)
    )
    end = terminal(events)
    assert isinstance(end, Finished) and end.finish_reason == "length"
    assert end.usage.completion_tokens == 3 and text(events).startswith("{")


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (StructuredOutputs(regex="(ab"), "structured_outputs.regex"),
        (StructuredOutputs(json='{"type": "nonsense"}'), "structured_outputs.json"),
        (StructuredOutputs(json="[1, 2"), "structured_outputs.json"),
        (StructuredOutputs(grammar='root ::= "a" |'), "structured_outputs.grammar"),
        (StructuredOutputs(choice=()), "structured_outputs.choice"),
        (StructuredOutputs(regex="a", choice=("a",)), "structured_outputs"),
    ],
)
async def test_bad_specs_are_rejected_naming_the_field(
    engine: Engine, spec: StructuredOutputs, field: str
) -> None:
    events = await collect(engine, PROMPT, SamplingParams(max_tokens=4, structured_outputs=spec))
    end = terminal(events)
    assert isinstance(end, Rejected) and end.field == field, end


async def test_ignore_eos_with_structured_output_is_rejected(engine: Engine) -> None:
    params = SamplingParams(ignore_eos=True, structured_outputs=StructuredOutputs(regex="a+"))
    end = terminal(await collect(engine, PROMPT, params))
    assert isinstance(end, Rejected) and end.field == "ignore_eos"


async def test_parallel_samples_each_follow_the_schema(engine: Engine) -> None:
    """n = 4 samples of one prompt share its prefill (sample_fork.py), then each is constrained
    by its own grammar state: every one validates, and they differ (sampled, seed + index)."""
    schema = make_schemas(1)[0]
    spec = StructuredOutputs.from_schema(schema)
    params = SamplingParams(max_tokens=48, temperature=1.0, seed=3, n=4, structured_outputs=spec)
    events = await collect(engine, "Four JSON objects, one each:", params)
    samples = by_index(events)
    assert sorted(samples) == [0, 1, 2, 3]
    texts = []
    for sample in samples.values():
        end = sample[-1]
        assert isinstance(end, Finished) and end.finish_reason == "stop", end
        texts.append(text(sample))
        jsonschema.validate(json.loads(texts[-1]), json.loads(spec.json))  # type: ignore[arg-type]
    assert len(set(texts)) > 1, texts
    await wait_blocks_free(engine)
