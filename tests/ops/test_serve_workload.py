"""`troupe bench serve`'s workload (ops/serve_workload.py): a pure function of its seed, vLLM's
length rules, the ShareGPT stand-in, gamma arrivals, and the structured share."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from troupe.ops.serve_workload import (
    LengthSpec,
    RampUp,
    arrival_times,
    make_requests,
    sample_lengths,
)


def test_the_workload_is_a_pure_function_of_its_seed() -> None:
    spec = LengthSpec(input_len=64, output_len=16, range_ratio=0.5)
    first = make_requests(spec, 50, seed=3, request_rate=10.0)
    assert first == make_requests(spec, 50, seed=3, request_rate=10.0)
    other = make_requests(spec, 50, seed=4, request_rate=10.0)
    assert [r.prompt_ids for r in first] != [r.prompt_ids for r in other]
    # Arrivals draw from their own stream: another rate keeps the prompts and lengths.
    faster = make_requests(spec, 50, seed=3, request_rate=100.0)
    assert [(r.prompt_ids, r.output_len) for r in faster] == [
        (r.prompt_ids, r.output_len) for r in first
    ]
    assert all(r.input_len == len(r.prompt_ids) and max(r.prompt_ids) < 10_000 for r in first)


def test_a_structured_share_gets_schemas_and_keeps_the_rest_of_the_workload() -> None:
    spec = LengthSpec(input_len=16, output_len=8, range_ratio=0.5)
    plain = make_requests(spec, 40, seed=3, request_rate=10.0)
    mixed = make_requests(spec, 40, seed=3, request_rate=10.0, structured_ratio=0.25)
    assert mixed == make_requests(spec, 40, seed=3, request_rate=10.0, structured_ratio=0.25)
    structured = [r for r in mixed if r.schema is not None]
    assert len(structured) == 10 and all(r.schema is None for r in plain)
    assert len({json.dumps(r.schema, sort_keys=True) for r in structured}) == 10  # each its own
    strip = [(r.prompt_ids, r.output_len, r.arrival_s) for r in mixed]
    assert strip == [(r.prompt_ids, r.output_len, r.arrival_s) for r in plain]
    assert all(r.schema is not None for r in make_requests(spec, 5, seed=3, structured_ratio=1))
    with pytest.raises(ValueError, match="structured_ratio"):
        make_requests(spec, 5, seed=3, structured_ratio=1.5)


def test_random_lengths_fixed_by_ratio_or_explicit_bounds() -> None:
    rng = np.random.default_rng(0)
    fixed_in, fixed_out = sample_lengths(LengthSpec(input_len=100, output_len=7), 200, rng)
    assert set(fixed_in) == {100} and set(fixed_out) == {7}
    ins, outs = sample_lengths(LengthSpec(input_len=100, output_len=10, range_ratio=0.5), 5000, rng)
    assert (min(ins), max(ins), min(outs), max(outs)) == (50, 150, 5, 15)  # vLLM's floor / ceil
    spec = LengthSpec(min_input_len=128, max_input_len=1024, min_output_len=64, max_output_len=512)
    ins, outs = sample_lengths(spec, 5000, rng)
    assert (min(ins), max(ins), min(outs), max(outs)) == (128, 1024, 64, 512)
    assert abs(np.mean(ins) - 576) < 15  # uniform: the middle of the range
    for bad in (
        {"range_ratio": 1.0},
        {"min_input_len": 10, "max_input_len": 5},
        {"min_output_len": 0},
    ):
        with pytest.raises(ValueError):
            LengthSpec(**bad)  # type: ignore[arg-type]


def test_sharegpt_synth_is_skewed_and_filtered_like_vllms_sharegpt() -> None:
    ins, outs = sample_lengths(
        LengthSpec(dataset="sharegpt-synth"), 20_000, np.random.default_rng(1)
    )
    a, b = np.array(ins), np.array(outs)
    assert len(a) == 20_000
    assert a.min() >= 4 and a.max() <= 1024 and b.min() >= 4 and (a + b).max() <= 2048
    assert 145 < a.mean() < 175 and 310 < b.mean() < 370  # ShareGPT: 161 and 338
    assert np.median(a) < 0.8 * a.mean() and np.median(b) < 0.85 * b.mean()  # long right tails


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_arrivals_have_the_rate_and_gamma_shape(burstiness: float) -> None:
    times = arrival_times(20_001, 8.0, burstiness, np.random.default_rng(2))
    gaps = np.diff(times)
    assert times[0] == 0.0 and (gaps >= 0).all()
    assert abs(gaps.mean() - 1 / 8) < 0.03 / 8  # mean gap 1 / rate
    # gamma(k, theta): the gaps' coefficient of variation is 1 / sqrt(k) (Poisson: 1)
    assert abs(gaps.std() / gaps.mean() - 1 / math.sqrt(burstiness)) < 0.05
    assert arrival_times(5, math.inf, 1.0, np.random.default_rng(0)) == [0.0] * 5
    with pytest.raises(ValueError):
        arrival_times(5, 0.0, 1.0, np.random.default_rng(0))


def test_ramp_up_rates_go_from_start_to_end() -> None:
    linear = RampUp("linear", 2.0, 10.0).rates(5)
    assert linear.tolist() == pytest.approx([2.0, 4.0, 6.0, 8.0, 10.0])
    geometric = RampUp("exponential", 1.0, 16.0).rates(5)
    assert geometric.tolist() == pytest.approx([1.0, 2.0, 4.0, 8.0, 16.0])
    assert RampUp("linear", 3.0, 1.0).rates(3).tolist() == pytest.approx([3.0, 2.0, 1.0])
    for bad in (("linear", 0.0, 4.0), ("exponential", 1.0, math.inf), ("step", 1.0, 2.0)):
        with pytest.raises(ValueError):
            RampUp(*bad)  # type: ignore[arg-type]


def test_a_ramp_draws_each_gap_at_its_requests_rate() -> None:
    # a huge gamma shape makes every gap its mean, 1 / rate of the request after it
    rng = np.random.default_rng(0)
    times = arrival_times(5, math.inf, 1e9, rng, RampUp("linear", 1.0, 4.0))
    gaps = np.diff(times)
    expected = [1 / 1.75, 1 / 2.5, 1 / 3.25, 1 / 4]
    assert times[0] == 0.0 and gaps.tolist() == pytest.approx(expected, rel=1e-3)
    # the ramp moves only the arrivals: prompts and lengths stay the seed's
    spec = LengthSpec(input_len=16, output_len=4, range_ratio=0.5)
    ramped = make_requests(spec, 20, seed=1, ramp=RampUp("exponential", 1.0, 50.0))
    plain = make_requests(spec, 20, seed=1, request_rate=10.0)
    assert [(r.prompt_ids, r.output_len) for r in ramped] == [
        (r.prompt_ids, r.output_len) for r in plain
    ]
    assert np.all(np.diff([r.arrival_s for r in ramped]) > 0)
