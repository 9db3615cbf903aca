"""The fake model's arithmetic (gpu/fake_runner.py): a KV slot's mix of its position and token,
and the next token as a hash of a sequence's slot mixes, length, seed and outputs so far. Pure
functions of their arguments, so FakeRunner.reference_tokens can compute outputs without a cache.
"""

from __future__ import annotations

import numpy as np
from troupe.messages import PromptLogprobs, SamplingParams, SeqWork, TokenLogprob
from troupe.messages.pooling import Pooled

EOS_SEED_BASE = 10**12
COPY_SEED_BASE = 2 * 10**12
_LOW, _HIGH = 100, 30000
U64 = np.uint64


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    x = (x ^ (x >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> U64(27))) * U64(0x94D049BB133111EB)
    out: np.ndarray = x ^ (x >> U64(31))
    return out


def slot_mix(positions: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
    """What one KV slot contributes to the hash: a mix of its position and token."""
    pos = positions.astype(U64)
    tok = token_ids.astype(U64)
    return _mix(pos * U64(0x9E3779B97F4A7C15) + tok + U64(1))


def next_tokens(
    sums: np.ndarray,
    lengths: np.ndarray,
    seeds: np.ndarray,
    num_outputs: np.ndarray,
    eos_token_id: int,
) -> np.ndarray:
    """Next token per sequence from its slot-mix sum, length, seed and outputs so far."""
    x = _mix(sums ^ _mix(lengths.astype(U64) + U64(0x632BE59BD9B4E019)) ^ _mix(seeds.astype(U64)))
    tokens = (x % U64(_HIGH - _LOW)).astype(np.int64) + _LOW
    eos_at = seeds.astype(np.int64) - EOS_SEED_BASE
    return np.where(num_outputs + 1 == eos_at, eos_token_id, tokens)


def seed_of(params: SamplingParams | None) -> int:
    return params.seed if params is not None and params.seed is not None else 0


def fake_logprob(token_id: int, num_top: int | None) -> TokenLogprob | None:
    if num_top is None:
        return None
    top = tuple(((token_id + i) % _HIGH, -1.0 - i) for i in range(num_top))
    return TokenLogprob(token_id, -1.0, top)


def fake_prompt_logprobs(work: SeqWork, num_top: int) -> PromptLogprobs:
    """Made-up logprobs of the prompt tokens `work` scores: a function of the position and the
    token, so a test can tell each position's from another's."""
    after = (work.after_chunk,) if work.after_chunk >= 0 else ()
    targets = (work.token_ids[1:] + after)[: work.num_scored]
    start = work.start_pos + 1
    entries = []
    for i, token_id in enumerate(targets):
        logprob = -((start + i) % 97 + token_id % 89) / 16.0
        top = tuple(((token_id + j) % _HIGH, logprob - j) for j in range(num_top))
        entries.append(TokenLogprob(token_id, logprob, top))
    return PromptLogprobs(work.request_id, start, tuple(entries))


def fake_embedding(work: SeqWork, params: SamplingParams) -> Pooled | None:
    """A made-up embedding, once the chunk holding the prompt's last token comes (any pooling
    type): a function of that token and its position, normalized if asked."""
    if params.pooling is None or not work.sample:  # not pooled, or the prompt goes on
        return None
    last = work.start_pos + len(work.token_ids) - 1
    raw = [((work.token_ids[-1] * (i + 3) + last) % 17 - 8) / 4.0 for i in range(8)]
    if params.pooling.normalize:
        norm = sum(v * v for v in raw) ** 0.5 or 1.0
        raw = [v / norm for v in raw]
    return Pooled(work.request_id, tuple(raw))


def held_back(token_id: int, num_outputs: int, params: SamplingParams, eos_token_id: int) -> int:
    """min_tokens on a model without logits: a stop token (EOS unless ignored, stop_token_ids)
    drawn before `params.min_tokens` outputs becomes the next id that is none, as masking the
    stop tokens' logits would make another token win."""
    if num_outputs >= params.min_tokens:
        return token_id
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else {eos_token_id})
    while token_id in stops:
        token_id = _LOW + (token_id + 1 - _LOW) % (_HIGH - _LOW)
    return token_id
