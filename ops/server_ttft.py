"""The server's own TTFT over a `bench serve` run: troupe's /metrics histogram
(`troupe_time_to_first_token_seconds`, from the gateway's arrival stamp to the first token),
read before and after the load. What the client measures beyond it happened before the
gateway's handler stamped the request: the client's sends, the accepts, the HTTP parsing
(issue 9's burst, docs/benchmarks.md session 18). Another server (no such histogram): None.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import aiohttp
from troupe.ops.serve_metrics import percentile_word

BUCKET = "troupe_time_to_first_token_seconds_bucket"
# `BUCKET{...le="0.1"...} 12.0`, the labels in any order
_BUCKET_LINE = re.compile(BUCKET + r'\{[^}]*\ble="([^"]+)"[^}]*\}\s+(\S+)')
Buckets = dict[float, float]  # upper bound (s) -> cumulative count


def parse_buckets(text: str) -> Buckets | None:
    """The histogram's buckets in a Prometheus text page, None if it has none. Its other
    labels (troupe's model_name) are ignored: a server serves one model."""
    out: Buckets = {}
    for line in text.splitlines():
        match = _BUCKET_LINE.match(line)
        if match is not None:
            bound = float(match.group(1))
            out[bound] = out.get(bound, 0.0) + float(match.group(2))
    return out or None


async def read_buckets(
    session: aiohttp.ClientSession, base_url: str, headers: Mapping[str, str]
) -> Buckets | None:
    """The server's buckets now, None where /metrics does not answer with them."""
    try:
        async with session.get(f"{base_url}/metrics", headers=dict(headers)) as resp:
            if resp.status != 200:
                return None
            return parse_buckets(await resp.text())
    except aiohttp.ClientError:
        return None


def quantiles(
    before: Buckets | None, after: Buckets | None, percentiles: Sequence[float]
) -> dict[str, float] | None:
    """The percentiles (ms) of what the run added, interpolated linearly within a bucket as
    Prometheus's histogram_quantile does (past the last finite bound: that bound); None
    without both readings or without new observations."""
    if not before or not after:
        return None
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]  # cumulative, this run's
    total = counts[-1]
    if total <= 0:
        return None
    out: dict[str, float] = {}
    for p in percentiles:
        rank = p / 100 * total
        i = next(i for i, count in enumerate(counts) if count >= rank)
        low, below = (bounds[i - 1], counts[i - 1]) if i else (0.0, 0.0)
        if math.isinf(bounds[i]):
            value = low
        else:
            share = (rank - below) / (counts[i] - below) if counts[i] > below else 1.0
            value = low + (bounds[i] - low) * share
        out[f"p{percentile_word(p)}"] = value * 1e3
    return out
