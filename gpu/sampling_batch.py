"""Build a SamplingBatch from the sampled requests' params and token histories."""

from __future__ import annotations

import numpy as np
import torch
from troupe.gpu.sampler import SamplingBatch, row_keys
from troupe.gpu.step_inputs import RequestState


def build_sampling_batch(
    states: list[RequestState], vocab_size: int, device: torch.device
) -> SamplingBatch:
    """One row per sampled request. The sampled token's position is the request's num_tokens."""
    params = [s.params for s in states]
    greedy = [p.temperature == 0.0 for p in params]
    top_k = [p.top_k if p.top_k > 0 else vocab_size for p in params]

    def floats(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32).to(device, non_blocking=True)

    keys = [row_keys(s.seed, s.num_tokens) for s in states]
    random_rows = [not g for g in greedy]
    batch = SamplingBatch(
        temperature=floats([p.temperature for p in params]),
        top_k=torch.tensor(top_k, dtype=torch.int64).to(device, non_blocking=True),
        top_p=floats([p.top_p for p in params]),
        min_p=floats([p.min_p for p in params]),
        keys=torch.tensor(keys, dtype=torch.int64).reshape(-1, 2).to(device, non_blocking=True),
        presence=floats([p.presence_penalty for p in params]),
        frequency=floats([p.frequency_penalty for p in params]),
        repetition=floats([p.repetition_penalty for p in params]),
        num_logprobs=tuple(p.logprobs for p in params),
        all_greedy=all(greedy),
        use_top_k=any(r and k < vocab_size for r, k in zip(random_rows, top_k, strict=True)),
        use_top_p=any(r and p.top_p < 1.0 for r, p in zip(random_rows, params, strict=True)),
        use_min_p=any(r and p.min_p > 0.0 for r, p in zip(random_rows, params, strict=True)),
    )
    uses_output = [p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params]
    uses_seen = [p.repetition_penalty != 1.0 for p in params]
    if any(uses_output):
        batch.output_counts = _counts(states, uses_output, vocab_size, device, prompt=False)
    if any(uses_seen):
        seen = _counts(states, uses_seen, vocab_size, device, prompt=True) > 0
        batch.seen_mask = seen
    return batch


def _counts(
    states: list[RequestState],
    rows: list[bool],
    vocab_size: int,
    device: torch.device,
    *,
    prompt: bool,
) -> torch.Tensor:
    """[S, V] token counts per row: output tokens (or prompt + output when `prompt`)."""
    pieces = []
    owners = []
    for row, (state, wanted) in enumerate(zip(states, rows, strict=True)):
        if not wanted:
            continue
        first = 0 if prompt else min(state.num_prompt_tokens, state.num_tokens)
        piece = state.tokens[first : state.num_tokens]
        pieces.append(piece)
        owners.append(np.full(len(piece), row, dtype=np.int64))
    counts = torch.zeros(len(states), vocab_size, dtype=torch.float32, device=device)
    if pieces:
        tokens = torch.from_numpy(np.concatenate(pieces)).to(device)
        owner = torch.from_numpy(np.concatenate(owners)).to(device)
        counts.index_put_(
            (owner, tokens), torch.ones_like(tokens, dtype=torch.float32), accumulate=True
        )
    return counts
