"""Per-request sparse logit edits: `logit_bias` (added) and `min_tokens` (stop tokens banned).

Both are vLLM's logits processors, applied to the logits before penalties, temperature and
filters (and before the grammar's mask). Logprobs still come from the raw logits.

A request's edits are folded into numpy arrays once, when its params reach the executor
(`RequestEdits`); each step gathers the rows that have any into three index tensors and one
value tensor, one host->device copy each, and applies them out of place:

    bias:  logits[row, token] += value     for each (token, value) of the row's logit_bias
    ban:   logits[row, token] = -inf       for each stop token, while the row's output tokens
                                           (sampled position - prompt length) < min_tokens

A step with no such row builds nothing and costs nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from troupe.messages import SamplingParams


@dataclasses.dataclass(frozen=True, kw_only=True)
class RequestEdits:
    """One request's edits as arrays (built once per params)."""

    bias_ids: np.ndarray  # int64 [B]
    bias_values: np.ndarray  # float32 [B]
    min_tokens: int
    ban_ids: np.ndarray  # int64 [K]: EOS (unless ignore_eos) and stop_token_ids


def request_edits(params: SamplingParams, eos_token_ids: Sequence[int]) -> RequestEdits | None:
    """The request's edits, or None when it has none (the common case)."""
    bias = params.logit_bias or {}
    if not bias and not params.min_tokens:
        return None
    stops = set(params.stop_token_ids)
    if not params.ignore_eos:
        stops.update(eos_token_ids)
    return RequestEdits(
        bias_ids=np.fromiter(bias.keys(), np.int64, len(bias)),
        bias_values=np.fromiter(bias.values(), np.float32, len(bias)),
        min_tokens=params.min_tokens,
        ban_ids=np.array(sorted(stops) if params.min_tokens else [], dtype=np.int64),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class LogitEdits:
    """One step's edits as device tensors (rows index the step's sampled rows)."""

    bias_rows: torch.Tensor  # int64 [N]
    bias_ids: torch.Tensor  # int64 [N]
    bias_values: torch.Tensor  # float32 [N]
    ban_rows: torch.Tensor  # int64 [M]
    ban_ids: torch.Tensor  # int64 [M]


def build_logit_edits(
    edits: Sequence[RequestEdits | None],
    num_outputs: np.ndarray,
    device: torch.device,
) -> LogitEdits | None:
    """The step's edits; `num_outputs[i]`: output tokens row i has before its sampled one."""
    bias_rows, bias_ids, bias_values, ban_rows, ban_ids = [], [], [], [], []
    for row, edit in enumerate(edits):
        if edit is None:
            continue
        if len(edit.bias_ids):
            bias_rows.append(np.full(len(edit.bias_ids), row, np.int64))
            bias_ids.append(edit.bias_ids)
            bias_values.append(edit.bias_values)
        if num_outputs[row] < edit.min_tokens and len(edit.ban_ids):
            ban_rows.append(np.full(len(edit.ban_ids), row, np.int64))
            ban_ids.append(edit.ban_ids)
    if not bias_rows and not ban_rows:
        return None
    return LogitEdits(
        bias_rows=_upload(bias_rows, np.int64, device),
        bias_ids=_upload(bias_ids, np.int64, device),
        bias_values=_upload(bias_values, np.float32, device),
        ban_rows=_upload(ban_rows, np.int64, device),
        ban_ids=_upload(ban_ids, np.int64, device),
    )


def _upload(pieces: list[np.ndarray], dtype: type, device: torch.device) -> torch.Tensor:
    host = torch.from_numpy(np.concatenate(pieces) if pieces else np.zeros(0, dtype))
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host


def apply_logit_edits(logits: torch.Tensor, edits: LogitEdits) -> torch.Tensor:
    """New fp32 logits with the biases added and the banned tokens at -inf (never in place:
    the caller's tensor is the raw logits that logprobs read, or a CUDA graph's buffer)."""
    out = logits.index_put((edits.bias_rows, edits.bias_ids), edits.bias_values, accumulate=True)
    return out.index_put(
        (edits.ban_rows, edits.ban_ids), torch.tensor(float("-inf"), device=logits.device)
    )
