"""`generate_batch`: the synchronous entry point for offline batch jobs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from troupe.actors.engine import Engine
from troupe.config import EngineConfig
from troupe.messages import (
    Aborted,
    Delta,
    Finished,
    SamplingParams,
    StreamEvent,
    Timings,
    TokenLogprob,
    Usage,
)


@dataclass
class Completion:
    """One prompt's whole output. `error` is set when it did not finish normally."""

    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None  # SamplingParams.logprobs: each output token's
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None  # positions 1.. of the prompt
    embedding: tuple[float, ...] | None = None  # SamplingParams.pooling


def generate_batch(
    prompts: Sequence[Any],
    params: SamplingParams | Mapping[str, Any] | Sequence[SamplingParams] | None = None,
    config: EngineConfig | None = None,
    *,
    progress: bool = True,
    backend: str = "asyncio",
) -> list[Completion]:
    """Run every prompt to completion and return the outputs in prompt order.

    `params` is one SamplingParams for all prompts or one per prompt; None: the model's
    defaults (Engine.default_sampling_params, vLLM's get_default_sampling_params). Shows a
    tqdm progress bar of finished requests unless `progress=False`.
    """
    if isinstance(params, Sequence) and not isinstance(params, Mapping):
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} params for {len(prompts)} prompts")
        per_prompt = list(params)
    else:
        per_prompt = [params] * len(prompts)  # type: ignore[list-item]
    for p in per_prompt:
        n = p.n if isinstance(p, SamplingParams) else (p or {}).get("n", 1)
        if n != 1:
            raise ValueError(
                f"generate_batch gives one Completion per prompt, and n is {n!r}: for "
                "parallel samples use troupe.LLM.generate, whose RequestOutput holds each"
            )
    results = [Completion(request_id=f"batch-{i}") for i in range(len(prompts))]

    async def run_all() -> None:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), disable=not progress, unit="req")
        all_done = anyio.Event()
        num_done = 0

        def collector(out: Completion) -> Callable[[StreamEvent], None]:
            def on_event(event: StreamEvent) -> None:
                nonlocal num_done
                out.text += event.text
                out.token_ids.extend(event.token_ids)
                if isinstance(event, Delta | Finished):
                    if event.prompt_logprobs is not None:
                        out.prompt_logprobs = event.prompt_logprobs
                    if event.embedding is not None:
                        out.embedding = event.embedding
                    if event.logprobs is not None:
                        out.logprobs = (out.logprobs or []) + list(event.logprobs)
                if isinstance(event, Delta):
                    return
                out.finish_reason = str(event.finish_reason)
                if isinstance(event, Finished | Aborted):
                    out.usage, out.timings = event.usage, event.timings
                else:  # Rejected, Failed
                    out.error = event.message
                num_done += 1
                bar.update(1)
                if num_done == len(prompts):
                    all_done.set()

            return on_event

        async with Engine.open(config or EngineConfig()) as engine:
            for index, out in enumerate(results):
                await engine.submit(
                    prompts[index], per_prompt[index], collector(out), request_id=out.request_id
                )
            if prompts:
                await all_done.wait()
        bar.close()

    anyio.run(run_all, backend=backend)
    return results
