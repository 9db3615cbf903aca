"""Parallel sampling's names: the ids of a request's samples and each sample's parameters.

A request with `num_samples` k > 1 runs as k sequences once its prompt is prefilled; sample i
is the sequence `sample_id(request_id, i)`. Client request ids may not contain SAMPLE_SEP
(admission refuses them), so a sample's id never clashes with a client's.

Seeds: with a request seed s, sample i draws with seed (s + i) mod 2**63, so sample i is
token-for-token the same request run alone (n=1) with that seed. Without a seed every sample
draws its own seed, as any unseeded request does.
"""

from __future__ import annotations

import msgspec
from troupe.messages.sampling import SamplingParams

SAMPLE_SEP = "\x1f"
SEED_MODULUS = 2**63


def sample_id(request_id: str, index: int) -> str:
    return f"{request_id}{SAMPLE_SEP}{index}"


def sample_params(params: SamplingParams, index: int) -> SamplingParams:
    """The parameters sample `index` runs with: one sequence, its own seed; with best_of > n,
    the sampled token's logprob too (the ranking sums it; the streamer drops what the client
    did not ask for)."""
    seed = None if params.seed is None else (params.seed + index) % SEED_MODULUS
    ranks = params.best_of is not None and params.best_of > params.n
    logprobs = 0 if ranks and params.logprobs is None else params.logprobs
    return msgspec.structs.replace(params, n=1, best_of=None, seed=seed, logprobs=logprobs)
