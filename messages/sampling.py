"""Sampling parameters: what a client may ask of one generation, and the checks on it."""

from __future__ import annotations

import math

import msgspec


class ParamError(ValueError):
    """A request field broke a limit. `field` names it; the message names the limit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to sample one request. Values are checked by `check()` (Admission calls it)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n alternatives per token; 0 = only the sampled token's
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    priority: int = 0  # higher runs first
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def check(self, *, max_logprobs: int = 20, vocab_size: int | None = None) -> None:
        """Raise ParamError naming the first field outside its limits."""
        if self.max_tokens < 1:
            raise ParamError("max_tokens", f"max_tokens must be >= 1, got {self.max_tokens}")
        _finite_at_least("temperature", self.temperature, 0.0)
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ParamError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ParamError("top_k", f"top_k must be -1, 0 (off) or >= 1, got {self.top_k}")
        if not (math.isfinite(self.min_p) and 0.0 <= self.min_p <= 1.0):
            raise ParamError("min_p", f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None and not (0 <= self.seed < 2**63):
            raise ParamError("seed", f"seed must be in [0, 2**63), got {self.seed}")
        if any(not s for s in self.stop):
            raise ParamError("stop", "stop strings must be non-empty")
        if len(self.stop) > 16:
            raise ParamError("stop", f"at most 16 stop strings, got {len(self.stop)}")
        for token_id in self.stop_token_ids:
            if token_id < 0 or (vocab_size is not None and token_id >= vocab_size):
                raise ParamError(
                    "stop_token_ids", f"stop token id {token_id} is outside [0, {vocab_size})"
                )
        if self.logprobs is not None and not (0 <= self.logprobs <= max_logprobs):
            raise ParamError(
                "logprobs", f"logprobs must be in [0, {max_logprobs}], got {self.logprobs}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -2.0 <= value <= 2.0):
                raise ParamError(name, f"{name} must be in [-2, 2], got {value}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0.0):
            raise ParamError(
                "repetition_penalty",
                f"repetition_penalty must be > 0, got {self.repetition_penalty}",
            )


def _finite_at_least(field: str, value: float, low: float) -> None:
    if not (math.isfinite(value) and value >= low):
        raise ParamError(field, f"{field} must be a finite number >= {low}, got {value}")
