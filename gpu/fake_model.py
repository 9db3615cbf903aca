"""The fake model's arithmetic (gpu/fake_runner.py): a KV slot's mix of its position and token,
and the next token as a hash of a sequence's slot mixes, length, seed and outputs so far. Pure
functions of their arguments, so FakeRunner.reference_tokens can compute outputs without a cache.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from troupe.gpu.thinking_budget import forced_token, thinking_budget
from troupe.gpu.token_bans import bad_words, banned_words
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
    if params.pooling.is_per_token:  # a row a prompt position, of the position alone
        rows = [_fake_row(p, params.pooling.normalize, p) for p in range(last + 1)]
        return Pooled(work.request_id, tuple(v for row in rows for v in row))
    return Pooled(work.request_id, _fake_row(last, params.pooling.normalize, work.token_ids[-1]))


def _fake_row(position: int, normalize: bool, token_id: int) -> tuple[float, ...]:
    raw = [((token_id * (i + 3) + position) % 17 - 8) / 4.0 for i in range(8)]
    if normalize:
        norm = sum(v * v for v in raw) ** 0.5 or 1.0
        raw = [v / norm for v in raw]
    return tuple(raw)


def reference_tokens(
    prompt_ids: Sequence[int],
    n: int,
    params: SamplingParams | None = None,
    eos_token_id: int = 2,
    *,
    kv_window: int = 0,
    block_size: int = 16,
) -> list[int]:
    """The `n` tokens a correct cache (gpu/fake_runner.py) gives after `prompt_ids` (not cut
    at EOS); with a window, as a FakeRunner of that kv_window and block_size gives them."""
    ids = np.asarray(prompt_ids, dtype=np.int64)
    mixes = slot_mix(np.arange(len(ids)), ids)
    total = mixes.sum(dtype=U64, keepdims=True)
    seed = np.array([seed_of(params)], np.int64)
    out: list[int] = []
    length = len(ids)
    period = int(seed[0]) - COPY_SEED_BASE
    for i in range(n):
        if kv_window:  # blocks from the window's first one on
            first = max(length - kv_window, 0) // block_size * block_size
            total = mixes[first:].sum(dtype=U64, keepdims=True)
        tok = int(next_tokens(total, np.array([length]), seed, np.array([i]), eos_token_id)[0])
        if 1 <= period <= length:
            tok = ([*prompt_ids, *out])[length - period]
        if params is not None:
            tok = held_back(tok, i, params, eos_token_id, out)
        out.append(tok)
        new = slot_mix(np.array([length]), np.array([tok]))
        if kv_window:
            mixes = np.concatenate([mixes, new])
        total = total + new  # arrays wrap silently
        length += 1
    return out


def held_back(
    token_id: int,
    num_outputs: int,
    params: SamplingParams,
    eos_token_id: int,
    output: Sequence[int] = (),
) -> int:
    """min_tokens, allowed_token_ids, bad_words and a thinking budget on a model without
    logits: a token they forbid (a stop token before `params.min_tokens` outputs, one outside
    the allowed set, a bad word's last token after the rest of it in `output`, the outputs so
    far) becomes the next id none forbids, as masking the logits would make another token win:
    the next allowed id (cyclically), else the next id in the fake range. All forbidden: the
    token stays. A spent thinking budget's forced token wins over all (gpu/thinking_budget.py)."""
    thinking = thinking_budget(params)
    if thinking is not None:
        forced = forced_token(thinking, np.asarray(output, np.int64))
        if forced is not None:
            return forced
    banned: set[int] = set()
    if num_outputs < params.min_tokens:
        banned.update(params.stop_token_ids)
        if not params.ignore_eos:
            banned.add(eos_token_id)
    words = bad_words(params.bad_words_token_ids)
    if words is not None:
        banned.update(banned_words(words, np.asarray(output, np.int64)).tolist())
    if params.allowed_token_ids is None and token_id not in banned:
        return token_id
    return next((t for t in _candidates(token_id, params) if t not in banned), token_id)


def _candidates(token_id: int, params: SamplingParams) -> Iterator[int]:
    """Ids in the order held_back tries them."""
    if params.allowed_token_ids is not None:
        allowed = sorted(set(params.allowed_token_ids))
        first = next((i for i, t in enumerate(allowed) if t >= token_id), 0)
        yield from allowed[first:] + allowed[:first]
        return
    yield token_id
    for _ in range(_HIGH - _LOW):
        token_id = _LOW + (token_id + 1 - _LOW) % (_HIGH - _LOW)
        yield token_id


def steers(params: SamplingParams) -> bool:
    """Whether held_back may change a token after min_tokens outputs (bans that last)."""
    bans = params.allowed_token_ids is not None or bool(params.bad_words_token_ids)
    return bans or params.thinking_token_budget is not None


def output_read(params: SamplingParams, num_outputs: int) -> int:
    """How many of its last output tokens held_back reads: a thinking budget's, all; a bad
    word's, the longest one's tokens but the last."""
    if params.thinking_token_budget is not None:
        return num_outputs
    return min(max(map(len, params.bad_words_token_ids), default=1) - 1, num_outputs)
