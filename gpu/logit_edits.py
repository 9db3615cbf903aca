"""Per-request sparse logit edits: `logit_bias` (added), `min_tokens` (stop tokens banned),
`bad_words` (word endings banned), `allowed_token_ids` (all else banned) and
`thinking_token_budget` (past it, the closing tag's next token alone allowed).

All are vLLM's logits processors, applied to the logits before penalties, temperature and
filters (and before the grammar's mask). Logprobs read the raw logits unless
EngineConfig.logprobs_mode asks for processed ones (gpu/sampler.drawn_from).

A request's edits are folded into numpy arrays once, when its params reach the executor
(`RequestEdits`); each step gathers the rows that have any into three index tensors and one
value tensor, one host->device copy each, and applies them out of place:

    bias:  logits[row, token] += value     for each (token, value) of the row's logit_bias
    ban:   logits[row, token] = -inf       for each stop token, while the row's output tokens
                                           (sampled position - prompt length) < min_tokens,
                                           and each bad word's last token the output leads
                                           to (gpu/token_bans.py: reads the row's history)
    allow: logits[row, token] = -inf       for each token not in the row's allowed_token_ids,
                                           or, where its thinking budget is spent, for each
                                           but the closing tag's next (gpu/thinking_budget.py:
                                           reads the row's history; then the row's other
                                           edits do not apply)

The bans and the mask are -inf whatever the bias, so their order does not matter (vLLM applies
the mask and bad words first, then min_tokens and the bias).

A step with no such row builds nothing and costs nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from troupe.gpu.thinking_budget import ThinkingBudget, ThinkingScan, forced_token, thinking_budget
from troupe.gpu.token_bans import BadWords, bad_words, banned_words
from troupe.messages import SamplingParams


@dataclasses.dataclass(frozen=True, kw_only=True)
class RequestEdits:
    """One request's edits as arrays (built once per params)."""

    bias_ids: np.ndarray  # int64 [B]
    bias_values: np.ndarray  # float32 [B]
    min_tokens: int
    ban_ids: np.ndarray  # int64 [K]: EOS (unless ignore_eos) and stop_token_ids
    allowed_ids: np.ndarray | None = None  # int64 [A]: allowed_token_ids
    words: BadWords | None = None  # bad_words
    thinking: ThinkingBudget | None = None  # thinking_token_budget
    scan: ThinkingScan | None = None  # where its thinking stood, kept between steps

    @property
    def reads_history(self) -> bool:
        """Whether a step's edits depend on the output so far beyond its count (bad words, a
        thinking budget): a batch of such rows is never reused for the next step."""
        words = self.words is not None and self.words.reads_history
        return words or self.thinking is not None

    def rewritten(self, first: int) -> None:
        """Its output tokens from `first` on were written again: a scan that read any of them
        reads from the start at the next step."""
        if self.scan is not None and first < self.scan.upto:
            self.scan.forget()


def request_edits(params: SamplingParams, eos_token_ids: Sequence[int]) -> RequestEdits | None:
    """The request's edits, or None when it has none (the common case)."""
    bias = params.logit_bias or {}
    allowed = params.allowed_token_ids
    words = bad_words(params.bad_words_token_ids)
    thinking = thinking_budget(params)
    if not bias and not params.min_tokens and allowed is None and words is None:
        if thinking is None:
            return None
    stops = set(params.stop_token_ids)
    if not params.ignore_eos:
        stops.update(eos_token_ids)
    return RequestEdits(
        bias_ids=np.fromiter(bias.keys(), np.int64, len(bias)),
        bias_values=np.fromiter(bias.values(), np.float32, len(bias)),
        min_tokens=params.min_tokens,
        ban_ids=np.array(sorted(stops) if params.min_tokens else [], dtype=np.int64),
        allowed_ids=None if allowed is None else np.unique(np.asarray(allowed, np.int64)),
        words=words,
        thinking=thinking,
        scan=None if thinking is None else ThinkingScan(),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class LogitEdits:
    """One step's edits as device tensors (rows index the step's sampled rows)."""

    bias_rows: torch.Tensor  # int64 [N]
    bias_ids: torch.Tensor  # int64 [N]
    bias_values: torch.Tensor  # float32 [N]
    ban_rows: torch.Tensor  # int64 [M]
    ban_ids: torch.Tensor  # int64 [M]
    allowed_rows: torch.Tensor | None = None  # int64 [R]: rows with allowed_token_ids
    allowed_row_of: torch.Tensor | None = None  # int64 [A]: each allowed id's row
    allowed_ids: torch.Tensor | None = None  # int64 [A]


def build_logit_edits(
    edits: Sequence[RequestEdits | None],
    num_outputs: np.ndarray,
    device: torch.device,
    histories: Sequence[np.ndarray | None] = (),
    ends: np.ndarray | None = None,
    settled: np.ndarray | None = None,
) -> LogitEdits | None:
    """The step's edits; `num_outputs[i]`: output tokens row i has before its sampled one,
    which are `histories[i][ends[i] - num_outputs[i] : ends[i]]` (read for bad words and
    thinking budgets); `settled[i]`: how many of them can no longer change (not proposals),
    which a thinking budget's scan keeps for the next step (None: it keeps none)."""
    bias_rows, bias_ids, bias_values, ban_rows, ban_ids = [], [], [], [], []
    allowed_rows, allowed_row_of, allowed_ids = [], [], []
    for row, edit in enumerate(edits):
        if edit is None:
            continue
        if edit.thinking is not None:  # its budget spent: the closing tag's next token only
            output = _output(histories, ends, num_outputs, row, edit)
            if settled is None:
                forced = forced_token(edit.thinking, output)
            else:
                forced = forced_token(edit.thinking, output, edit.scan, int(settled[row]))
            if forced is not None:
                allowed_rows.append(np.array([row], np.int64))
                allowed_row_of.append(np.array([row], np.int64))
                allowed_ids.append(np.array([forced], np.int64))
                continue
        if len(edit.bias_ids):
            bias_rows.append(np.full(len(edit.bias_ids), row, np.int64))
            bias_ids.append(edit.bias_ids)
            bias_values.append(edit.bias_values)
        bans = edit.ban_ids if num_outputs[row] < edit.min_tokens else None
        if edit.words is not None:
            words = banned_words(edit.words, _output(histories, ends, num_outputs, row, edit))
            bans = words if bans is None else np.concatenate([bans, words])
        if bans is not None and len(bans):
            ban_rows.append(np.full(len(bans), row, np.int64))
            ban_ids.append(bans)
        if edit.allowed_ids is not None:
            allowed_rows.append(np.array([row], np.int64))
            allowed_row_of.append(np.full(len(edit.allowed_ids), row, np.int64))
            allowed_ids.append(edit.allowed_ids)
    if not bias_rows and not ban_rows and not allowed_rows:
        return None
    return LogitEdits(
        bias_rows=_upload(bias_rows, np.int64, device),
        bias_ids=_upload(bias_ids, np.int64, device),
        bias_values=_upload(bias_values, np.float32, device),
        ban_rows=_upload(ban_rows, np.int64, device),
        ban_ids=_upload(ban_ids, np.int64, device),
        allowed_rows=_upload(allowed_rows, np.int64, device) if allowed_rows else None,
        allowed_row_of=_upload(allowed_row_of, np.int64, device) if allowed_rows else None,
        allowed_ids=_upload(allowed_ids, np.int64, device) if allowed_rows else None,
    )


def _output(
    histories: Sequence[np.ndarray | None],
    ends: np.ndarray | None,
    num_outputs: np.ndarray,
    row: int,
    edit: RequestEdits,
) -> np.ndarray:
    """Row `row`'s output tokens before its sampled one (empty where none are needed)."""
    if not edit.reads_history:
        return np.zeros(0, np.int64)
    history = histories[row] if row < len(histories) else None
    assert history is not None and ends is not None, "a row that reads its output keeps it"
    end = int(ends[row])
    return history[max(end - int(num_outputs[row]), 0) : end]


def _upload(pieces: list[np.ndarray], dtype: type, device: torch.device) -> torch.Tensor:
    host = torch.from_numpy(np.concatenate(pieces) if pieces else np.zeros(0, dtype))
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host


def apply_logit_edits(logits: torch.Tensor, edits: LogitEdits) -> torch.Tensor:
    """New fp32 logits with the biases added and the banned tokens (and those outside a row's
    allowed set) at -inf (never in place: the caller's tensor is the raw logits that logprobs
    read, or a CUDA graph's buffer)."""
    out = logits.index_put((edits.bias_rows, edits.bias_ids), edits.bias_values, accumulate=True)
    ninf = torch.tensor(float("-inf"), device=logits.device)
    out = out.index_put((edits.ban_rows, edits.ban_ids), ninf)
    if edits.allowed_rows is not None:
        assert edits.allowed_row_of is not None and edits.allowed_ids is not None
        outside = torch.zeros(out.shape, dtype=torch.bool, device=out.device)
        outside[edits.allowed_rows] = True
        outside[edits.allowed_row_of, edits.allowed_ids] = False
        out = out.masked_fill(outside, float("-inf"))
    return out
