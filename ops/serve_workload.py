"""The serving benchmark's workload: what each request asks for, and when it is sent.

Lengths, in tokens (`LengthSpec`):

    random          vLLM's random dataset: input and output lengths are integers drawn uniformly
                    from [floor(len * (1 - r)), ceil(len * (1 + r))] for --range-ratio r
                    (r = 0: every request the same, fixed lengths), or from explicit
                    [min, max] bounds when those are given.
    sharegpt-synth  a synthetic stand-in for ShareGPT as vLLM filters it (no download): lognormal
                    input and output lengths (`SHAREGPT_*` below: means ~160 and ~340 tokens,
                    medians ~110 and ~250, the vLLM paper reports 161 and 338), each pair redrawn
                    until 4 <= input <= 1024, output >= 4 and input + output <= 2048.

Prompts are token ids drawn uniformly from [0, PROMPT_ID_HIGH), so prompt lengths are exact
and two prompts share no prefix worth caching.

Arrivals: the first request at t = 0, then gaps drawn from a gamma distribution with shape
`burstiness` and mean 1 / rate (vLLM's definition: burstiness 1 is a Poisson process, lower is
burstier, higher is more regular); an infinite rate sends every request at t = 0. A ramp-up
(`RampUp`, vLLM's --ramp-up-strategy) gives request i of N its own rate instead, from the start
rate at i = 0 to the end rate at i = N - 1: linearly, or geometrically ("exponential"); the gap
before request i is drawn at request i's rate.

Lengths, prompt ids and arrivals each draw from their own child of one seed
(numpy `SeedSequence.spawn`), so changing the rate keeps the prompts and vice versa.

Structured output (`structured_ratio`, vLLM's --structured-output-ratio): that share of the
requests, picked by a fourth child, each asks for JSON following a schema of its own
(ops/json_schemas.py, the i-th structured request the i-th schema); the rest are unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

DatasetName = Literal["random", "sharegpt-synth"]
PROMPT_ID_HIGH = 10_000  # ids below every supported model's vocabulary size
SHAREGPT_INPUT = (4.7, 0.95)  # lognormal (mu, sigma) of prompt tokens
SHAREGPT_OUTPUT = (5.53, 0.85)  # the same for output tokens
SHAREGPT_MAX_INPUT, SHAREGPT_MAX_TOTAL, SHAREGPT_MIN_LEN = 1024, 2048, 4


@dataclass(frozen=True, kw_only=True)
class LengthSpec:
    """How long prompts and outputs are; `min_*`/`max_*` override the range ratio."""

    dataset: DatasetName = "random"
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    min_input_len: int | None = None
    max_input_len: int | None = None
    min_output_len: int | None = None
    max_output_len: int | None = None

    def __post_init__(self) -> None:
        if self.dataset not in ("random", "sharegpt-synth"):
            raise ValueError(f"dataset must be random or sharegpt-synth, got {self.dataset!r}")
        if not 0.0 <= self.range_ratio < 1.0:
            raise ValueError(f"range_ratio must be in [0, 1), got {self.range_ratio}")
        if self.input_len < 1 or self.output_len < 1:
            raise ValueError("input_len and output_len must be >= 1")
        self.input_bounds()  # raises on a bad explicit range
        self.output_bounds()

    def input_bounds(self) -> tuple[int, int]:
        return _bounds("input", self.input_len, self.range_ratio, self.min_input_len,
                       self.max_input_len, lowest=1)  # fmt: skip

    def output_bounds(self) -> tuple[int, int]:
        return _bounds("output", self.output_len, self.range_ratio, self.min_output_len,
                       self.max_output_len, lowest=1)  # fmt: skip


def _bounds(
    name: str, length: int, ratio: float, low: int | None, high: int | None, *, lowest: int
) -> tuple[int, int]:
    """Inclusive [low, high]: vLLM's floor/ceil of length * (1 -/+ ratio) unless given."""
    lo = low if low is not None else max(lowest, math.floor(length * (1 - ratio)))
    hi = high if high is not None else math.ceil(length * (1 + ratio))
    if lo < lowest or hi < lo:
        raise ValueError(f"{name} lengths need {lowest} <= min <= max, got [{lo}, {hi}]")
    return lo, hi


@dataclass(frozen=True)
class BenchRequest:
    """One planned request: its prompt, how many tokens to generate, when to send it."""

    index: int
    prompt_ids: list[int]
    output_len: int
    arrival_s: float  # seconds after the benchmark starts
    schema: dict[str, Any] | None = None  # the JSON schema its output follows, if structured

    @property
    def input_len(self) -> int:
        return len(self.prompt_ids)


def sample_lengths(
    spec: LengthSpec, num: int, rng: np.random.Generator
) -> tuple[list[int], list[int]]:
    """(input lengths, output lengths) of `num` requests."""
    if spec.dataset == "sharegpt-synth":
        return _sharegpt_lengths(num, rng)
    (in_lo, in_hi), (out_lo, out_hi) = spec.input_bounds(), spec.output_bounds()
    inputs = rng.integers(in_lo, in_hi + 1, size=num)
    outputs = rng.integers(out_lo, out_hi + 1, size=num)
    return [int(n) for n in inputs], [int(n) for n in outputs]


def _sharegpt_lengths(num: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    inputs: list[int] = []
    outputs: list[int] = []
    while len(inputs) < num:
        batch = 2 * (num - len(inputs)) + 16  # ~2% are redrawn: one round nearly always does
        ins = np.rint(rng.lognormal(*SHAREGPT_INPUT, size=batch)).astype(np.int64)
        outs = np.rint(rng.lognormal(*SHAREGPT_OUTPUT, size=batch)).astype(np.int64)
        keep = (
            (ins >= SHAREGPT_MIN_LEN)
            & (ins <= SHAREGPT_MAX_INPUT)
            & (outs >= SHAREGPT_MIN_LEN)
            & (ins + outs <= SHAREGPT_MAX_TOTAL)
        )
        inputs += [int(n) for n in ins[keep]]
        outputs += [int(n) for n in outs[keep]]
    return inputs[:num], outputs[:num]


@dataclass(frozen=True)
class RampUp:
    """Request rates rising (or falling) over the run: see the module doc."""

    strategy: Literal["linear", "exponential"]
    start_rps: float
    end_rps: float

    def __post_init__(self) -> None:
        if self.strategy not in ("linear", "exponential"):
            raise ValueError(
                f"ramp-up strategy must be linear or exponential, got {self.strategy!r}"
            )
        for name in ("start_rps", "end_rps"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"ramp-up {name} must be a finite rate > 0, got {value}")

    def rates(self, num: int) -> np.ndarray:
        """Request i's rate, for i in [0, num)."""
        progress = np.arange(num) / max(num - 1, 1)
        if self.strategy == "linear":
            return self.start_rps + (self.end_rps - self.start_rps) * progress
        return self.start_rps * (self.end_rps / self.start_rps) ** progress


def arrival_times(
    num: int,
    request_rate: float,
    burstiness: float,
    rng: np.random.Generator,
    ramp: RampUp | None = None,
) -> list[float]:
    """Send times in seconds: 0, then gamma gaps of mean 1 / rate (all 0 when rate is inf);
    with `ramp`, each gap at its request's own rate."""
    if not request_rate > 0 or not burstiness > 0:
        raise ValueError(
            f"request_rate and burstiness must be > 0, got {request_rate}, {burstiness}"
        )
    if num == 0:
        return []
    if ramp is None and math.isinf(request_rate):
        return [0.0] * num
    rates = ramp.rates(num)[1:] if ramp is not None else np.full(num - 1, request_rate)
    scale = 1.0 / (rates * burstiness)  # mean of gamma(k, theta) is k * theta
    gaps = rng.gamma(shape=burstiness, scale=scale, size=num - 1)
    return [0.0, *(float(t) for t in np.cumsum(gaps))]


def make_requests(
    spec: LengthSpec,
    num_prompts: int,
    *,
    seed: int,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    structured_ratio: float = 0.0,
    ramp: RampUp | None = None,
) -> list[BenchRequest]:
    """The whole workload, a pure function of its arguments."""
    if not 0.0 <= structured_ratio <= 1.0:
        raise ValueError(f"structured_ratio must be in [0, 1], got {structured_ratio:g}")
    length_rng, prompt_rng, arrival_rng, schema_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    inputs, outputs = sample_lengths(spec, num_prompts, length_rng)
    times = arrival_times(num_prompts, request_rate, burstiness, arrival_rng, ramp)
    schemas: list[dict[str, Any] | None] = [None] * num_prompts
    num_structured = round(structured_ratio * num_prompts)
    if num_structured:
        from troupe.ops.json_schemas import make_schemas

        picked = sorted(schema_rng.choice(num_prompts, size=num_structured, replace=False))
        for index, schema in zip(picked, make_schemas(num_structured), strict=True):
            schemas[int(index)] = schema
    return [
        BenchRequest(
            index=i,
            prompt_ids=[int(t) for t in prompt_rng.integers(0, PROMPT_ID_HIGH, size=n_in)],
            output_len=n_out,
            arrival_s=at,
            schema=schema,
        )
        for i, (n_in, n_out, at, schema) in enumerate(
            zip(inputs, outputs, times, schemas, strict=True)
        )
    ]
