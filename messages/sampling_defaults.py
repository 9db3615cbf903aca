"""The sampling parameters a request gets for the fields its client left unset: the model's
generation_config.json (vLLM's `--generation-config`), with EngineConfig's overrides.

The engine reads them at start (actors/generation_defaults.py) and shows them as
`Engine.sampling_defaults` (an engine in another process sends them in its Hello); the gateway
fills them into each OpenAI and websocket request where the body leaves a field out, and
`Engine.generate`/`submit` (hence `generate_batch`) given no params use `params()`. A client's
own value always wins, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from troupe.messages.sampling import ParamError, SamplingParams

# generation_config.json's keys that set a default, as vLLM reads them (its
# get_diff_sampling_param); HF's max_new_tokens is SamplingParams' max_tokens
GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                          "max_new_tokens")  # fmt: skip
_INT_KEYS = ("top_k", "max_new_tokens")


class SamplingDefaults(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Each field: the default of the SamplingParams field of the same name, or None where
    SamplingParams' own default stands."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    # chat's and responses' default max_tokens (capped by max_model_len); completions and
    # websocket frames keep 16, as vLLM's completions do
    max_tokens: int | None = None

    @classmethod
    def from_generation_config(cls, fields: Mapping[str, object]) -> SamplingDefaults:
        """The defaults a generation_config.json's keys give (keys other than
        GENERATION_CONFIG_KEYS, and null values, are ignored). ParamError naming the key of
        a value SamplingParams would refuse."""
        kwargs: dict[str, Any] = {}
        for key in GENERATION_CONFIG_KEYS:
            value = fields.get(key)
            is_int = isinstance(value, int) and not isinstance(value, bool)
            if value is None:
                continue
            if key in _INT_KEYS and is_int:
                kwargs["max_tokens" if key == "max_new_tokens" else key] = value
            elif key not in _INT_KEYS and (is_int or isinstance(value, float)):
                kwargs[key] = float(value)  # type: ignore[arg-type]  # an int or a float
            else:
                kind = "an integer" if key in _INT_KEYS else "a number"
                raise ParamError(key, f"{key} must be {kind}, got {value!r}")
        defaults = cls(**kwargs)
        try:
            SamplingParams(**defaults.as_kwargs()).check()
        except ParamError as exc:
            key = "max_new_tokens" if exc.field == "max_tokens" else exc.field
            raise ParamError(key, str(exc).replace("max_tokens", "max_new_tokens")) from None
        return defaults

    def as_kwargs(self) -> dict[str, Any]:
        """The fields that are set, by their SamplingParams names."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}

    def fill(self, given: dict[str, Any]) -> dict[str, Any]:
        """SamplingParams keyword arguments: `given` (what the client set), and these
        defaults, max_tokens apart, for what it left out."""
        sampling = {k: v for k, v in self.as_kwargs().items() if k != "max_tokens"}
        return {**sampling, **given}

    def max_tokens_within(self, limit: int) -> int:
        """The default max_tokens of a request that runs to the end of the context: this
        one's max_tokens where set, never past `limit` (max_model_len)."""
        return limit if self.max_tokens is None else min(self.max_tokens, limit)

    def params(self, max_model_len: int) -> SamplingParams:
        """The SamplingParams of a Python API request given none (vLLM's
        `LLM.get_default_sampling_params`): these defaults, max_tokens included (never past
        `max_model_len`), and SamplingParams' own for the fields they leave unset."""
        kwargs = self.as_kwargs()
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens_within(max_model_len)
        return SamplingParams(**kwargs)


NO_DEFAULTS = SamplingDefaults()
