"""Verifying proposals (speculative decoding): one step scores a sequence's token and its k
proposals (k + 1 logits rows), and the sampler draws a token at each of those positions as if
the proposals before it had been accepted. Proposals are accepted while they equal the draw;
the first draw that differs (or the draw after the last proposal) is the target's own token.

    fed       t   d1  d2  d3           (t: last token; d: proposals)
    rows      r0  r1  r2  r3           r_j: logits given t, d1..dj
    drawn     x0  x1  x2  x3           x_j from r_j, seeded by (seed, position), penalties
                                       counting d1..dj as output
    d1 = x0, d2 = x1, d3 != x2   ->    tokens x0 x1 x2 (2 proposals accepted)

This is the rejection-sampling rule for a proposal distribution that is a point mass (n-gram):
proposal d is accepted with probability p(d), and on rejection the token comes from p with d
removed and renormalised, i.e. from p given "not d", which is what x is when x != d. Each
draw uses the same counter-based noise as a step without proposals (sampler.py: a function of
seed, position and token), so a seeded request gives the same tokens with or without
speculation, and greedy rows (argmax) are token-identical by construction.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from troupe.gpu.overlap import LogitsHook
from troupe.gpu.request_states import RequestState
from troupe.gpu.runner import SequencesFailed
from troupe.gpu.sampler import WITHHELD, sample, withhold_non_finite
from troupe.gpu.sampling_batch import SamplingBatches
from troupe.messages import FailedSeq, SampledToken, SeqFailureReason, SeqWork


def verify_proposals(
    seqs: Sequence[SeqWork],
    states: Sequence[RequestState],
    rows: Sequence[int],
    num_logits: np.ndarray,
    logits: torch.Tensor,
    *,
    batches: SamplingBatches,
    logits_hook: LogitsHook | None = None,
) -> tuple[SampledToken, ...]:
    """One SampledToken per sampled seq (`rows`, plan order), its accepted proposals and the
    target's next token; `logits` has num_logits[i] rows for rows[i]. Raises SequencesFailed
    when a token the sequence needs came from non-finite logits. `batches`: the runner's
    (vocabulary, device and logprobs_mode)."""
    per = num_logits.tolist()
    row_states = [states[r] for r, n in zip(rows, per, strict=True) for _ in range(n)]
    offsets = np.concatenate([np.arange(n) for n in per]) if per else np.zeros(0, np.int64)
    if logits_hook is not None:
        ids = [seqs[r].request_id for r, n in zip(rows, per, strict=True) for _ in range(n)]
        with torch.inference_mode():
            logits_hook(ids, logits)
    batch = batches.build_rows(row_states, offsets)
    drawn, logprobs = sample(logits, batch)
    token_ids: list[int] = withhold_non_finite(drawn, logits).tolist()
    out: list[SampledToken] = []
    failed: list[FailedSeq] = []
    first = 0
    for r, n in zip(rows, per, strict=True):
        work = seqs[r]
        draft = work.draft_token_ids
        got = token_ids[first : first + n]
        accepted = 0
        while accepted < len(draft) and got[accepted] == draft[accepted]:
            accepted += 1
        if got[accepted] == WITHHELD:
            failed.append(FailedSeq(work.request_id, SeqFailureReason.NON_FINITE_LOGITS))
        else:
            lps = logprobs[first : first + accepted + 1]
            out.append(
                SampledToken(work.request_id, got[0], lps[0], tuple(got[1 : accepted + 1]), lps[1:])
            )
        first += n
    if failed:
        raise SequencesFailed(tuple(out), tuple(failed))
    return tuple(out)
