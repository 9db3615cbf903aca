"""Token buckets of the mixed-step CUDA graphs and their config knob (CPU: no graph captured)."""

from __future__ import annotations

import pytest
from troupe.config import ConfigError, EngineConfig
from troupe.gpu.mixed_graphs import bucket_rows, token_buckets


@pytest.mark.parametrize("max_tokens", [1, 100, 512, 4096, 8192, 16384, 5000])
def test_buckets_cover_every_step_size_with_bounded_padding(max_tokens: int) -> None:
    buckets = token_buckets(max_tokens)
    assert buckets == sorted(set(buckets)) and buckets[-1] == max_tokens
    for tokens in range(1, max_tokens + 1):
        bucket = next(b for b in buckets if b >= tokens)
        if tokens > 2048:
            assert bucket - tokens <= tokens / 8, (tokens, bucket)
        elif tokens > 512:
            assert bucket - tokens <= tokens / 4, (tokens, bucket)
        else:
            assert bucket - tokens < 64


def test_logits_rows_without_proposals_as_with_speculation_off() -> None:
    """A step that verifies nothing replays a graph with as many lm_head rows as without
    speculation; graphs with more rows exist only where proposals can need them."""
    buckets = token_buckets(4096)
    off = bucket_rows(buckets, 256, 256)
    spec = bucket_rows(buckets, 256, 256 * 5)
    assert all(len(rows) == 1 for rows in off.values())
    assert {size: rows[0] for size, rows in spec.items()} == {s: r[0] for s, r in off.items()}
    extra = [size for size, rows in spec.items() if len(rows) == 2]
    assert extra == [b for b in buckets if 256 < b <= 1280]  # 10 more captures
    assert all(spec[size][1] == min(size, 1280) for size in extra)


def test_bucket_count_stays_small_for_big_budgets() -> None:
    assert len(token_buckets(4096)) == 28
    assert len(token_buckets(16384)) == 44


@pytest.mark.parametrize("value", [-1, 1.5, "8192"])
def test_max_mixed_graph_tokens_is_checked(value: object) -> None:
    with pytest.raises(ConfigError, match="max_mixed_graph_tokens"):
        EngineConfig(max_mixed_graph_tokens=value)  # type: ignore[arg-type]
