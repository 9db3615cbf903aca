"""Sampling parameters: what a client may ask of one generation, and the checks on it."""

from __future__ import annotations

import math
import re

import msgspec
from troupe.messages.pooling import Pooling
from troupe.messages.structured import StructuredOutputs


class ParamError(ValueError):
    """A request field broke a limit. `field` names it; the message names the limit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ThinkingIds(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A thinking budget's tags as token ids (gpu/thinking_budget.py reads them): `start`
    opens thinking, `end` closes it; `opened`: the prompt ends inside thinking (its last
    `start` after its last `end`, as a template that opens the answer's thinking writes)."""

    start: tuple[int, ...]
    end: tuple[int, ...]
    opened: bool = False


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to sample one request. Values are checked by `check()` (Admission calls it)."""

    max_tokens: int = 16
    # vLLM's server: a max_tokens the prompt leaves no room for under max_model_len is rejected
    # (field max_tokens) instead of clipped there; the OpenAI routes set it where the client
    # named max_tokens (a default, and the Python API, clip as vLLM's LLM does)
    strict_max_tokens: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n alternatives per token; 0 = only the sampled token's
    # Each prompt token's logprob given the tokens before it (the first has none), with the
    # top-n alternatives as for `logprobs`; such a prompt is computed whole (no prefix-cache hit)
    prompt_logprobs: int | None = None
    # An embedding of the prompt (messages/pooling.py) on the first event; `last` pooling
    # keeps prefix-cache hits, the others compute the prompt whole
    pooling: Pooling | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    priority: int = 0  # lower runs first (as in vLLM); ties: first come, first served
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputs | None = None  # constrain the text (grammar actor)
    # Parallel sampling: `n` samples of one prompt (prefilled once, its KV blocks shared);
    # `best_of` >= n samples are drawn and the n with the highest cumulative logprob returned.
    # With a seed, sample i draws with seed + i (mod 2**63): sample i equals this request with
    # n=1 and that seed (messages/samples.py).
    n: int = 1
    best_of: int | None = None
    # token id -> added to its logit before penalties and filters (vLLM/OpenAI: [-100, 100])
    logit_bias: dict[int, float] | None = None
    # EOS and stop_token_ids are masked, and stop strings not matched, before this many
    # output tokens (vLLM's semantics)
    min_tokens: int = 0
    # StreamingLLM (attention sinks): keep the KV of the first `sink_tokens` tokens and of the
    # last `streaming_window` ones (the token itself included), free the blocks between, and
    # attend with positions within that cache; the request may then run past max_model_len.
    # None: the engine's default (EngineConfig fields of the same names); window 0: off.
    streaming_window: int | None = None
    sink_tokens: int | None = None
    # vLLM's: only these token ids may be sampled (every other logit -inf; logprobs stay raw)
    allowed_token_ids: tuple[int, ...] | None = None
    # vLLM's: a word's last token is banned wherever the output so far ends with the rest of
    # it (each word tokenized with and without a leading space, as vLLM does)
    bad_words: tuple[str, ...] | None = None
    # bad_words as token-id sequences: filled by the tokenizer actor from `bad_words` (what a
    # client sends here is replaced), so the executor, which never tokenizes, can apply them
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    # vLLM's: encode the prompt with the model's special tokens (BOS, ...) or without; None:
    # a text prompt's default is with, chat messages' without (their template writes them)
    add_special_tokens: bool | None = None
    # vLLM's: keep only the last k prompt tokens (-1: max_model_len); applied where the prompt
    # is tokenized, so usage counts the tokens that ran
    truncate_prompt_tokens: int | None = None
    # The LoRA adapter to run with: a name from EngineConfig.lora_modules (None: the base model)
    lora: str | None = None
    # vLLM's: prefix-cache hits only among requests of the same salt (and adapter)
    cache_salt: str | None = None
    # The prompt's token ids on the first event (vLLM's return_token_ids; the output's are on
    # every event): the tokenizer's, after the chat template and truncate_prompt_tokens
    return_prompt_token_ids: bool = False
    # vLLM's: at most this many tokens of thinking, then the tokens of the closing tag are
    # forced (0: closed at once); None: no limit. Needs `thinking_tags`, the texts that open
    # and close thinking ("<think>", "</think>": the server's from its reasoning parser)
    thinking_token_budget: int | None = None
    thinking_tags: tuple[str, str] | None = None
    # the answer starts inside thinking whatever the prompt says (DeepSeek-R1's parser)
    thinking_from_start: bool = False
    # thinking_tags as token ids, and whether the prompt leaves thinking open: filled by the
    # tokenizer actor (what a client sends here is replaced), for the executor
    thinking_ids: ThinkingIds | None = None

    @property
    def cache_namespace(self) -> str:
        """Whose prefix-cache entries this request may share: those of its adapter and salt
        (KV computed through an adapter is not the base model's)."""
        if self.lora is None and self.cache_salt is None:
            return ""
        return f"{self.lora or ''}\x1f{self.cache_salt or ''}"

    @property
    def is_streaming(self) -> bool:
        """Whether the request keeps only sinks + window of KV (after defaults are applied)."""
        return bool(self.streaming_window)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        """Sampling reads the request's token history (presence, frequency, repetition)."""
        return bool(
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    @property
    def needs_history(self) -> bool:
        """Sampling reads the request's earlier tokens: a penalty, a bad word of several
        tokens (its last one is banned only after the others), or a thinking budget."""
        words = any(len(w) > 1 for w in self.bad_words_token_ids)
        return self.has_penalties or words or self.thinking_token_budget is not None

    @property
    def num_samples(self) -> int:
        """Sequences the request runs: best_of if set, else n."""
        return self.best_of if self.best_of is not None else self.n

    def check(self, *, max_logprobs: int = 20, vocab_size: int | None = None) -> None:
        """Raise ParamError naming the first field outside its limits.

        Types first (a directly built SamplingParams is not type-checked by msgspec), then
        ranges. Every float must survive the device's float32 math unchanged: 0, or a
        magnitude in [1e-30, 1e30]; every int fits an int32 (seed: int64)."""
        try:
            msgspec.convert(msgspec.structs.asdict(self), SamplingParams)
        except msgspec.ValidationError as exc:
            match = _PATH.search(str(exc))
            field = match.group(1) if match else "params"
            raise ParamError(field, f"invalid '{field}': {_PATH.sub('', str(exc))}") from None
        _int_in("max_tokens", self.max_tokens, 1, INT32_MAX)
        t = self.temperature
        if t != 0.0 and not (math.isfinite(t) and FLOAT_FLOOR <= t <= FLOAT_CEIL):
            raise ParamError(
                "temperature",
                f"temperature must be 0 (greedy) or in [{FLOAT_FLOOR:g}, {FLOAT_CEIL:g}] "
                f"(float32-safe), got {t!r}",
            )
        _float_in("top_p", self.top_p, 0.0, 1.0, open_low=True)
        if self.top_k < -1:
            raise ParamError("top_k", f"top_k must be -1, 0 (off) or >= 1, got {self.top_k}")
        _int_in("top_k", self.top_k, -1, INT32_MAX)
        _float_in("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None and not (0 <= self.seed < 2**63):
            raise ParamError("seed", f"seed must be in [0, 2**63), got {self.seed}")
        if any(not s for s in self.stop):
            raise ParamError("stop", "stop strings must be non-empty")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ParamError(
                "stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}"
            )
        if any(len(s) > MAX_STOP_CHARS for s in self.stop):
            # The streamer's matcher holds back partial matches: its cost per token grows
            # with the square of the longest stop string, and it serves every request.
            raise ParamError("stop", f"each stop string must be at most {MAX_STOP_CHARS} chars")
        limit = vocab_size if vocab_size is not None else INT32_MAX + 1
        for token_id in self.stop_token_ids:
            if not 0 <= token_id < limit:
                raise ParamError(
                    "stop_token_ids", f"stop token id {token_id} is outside [0, {limit})"
                )
        if self.logprobs is not None and not (0 <= self.logprobs <= max_logprobs):
            raise ParamError(
                "logprobs", f"logprobs must be in [0, {max_logprobs}], got {self.logprobs}"
            )
        if self.prompt_logprobs is not None and not (0 <= self.prompt_logprobs <= max_logprobs):
            raise ParamError(
                "prompt_logprobs",
                f"prompt_logprobs must be in [0, {max_logprobs}], got {self.prompt_logprobs}",
            )
        _float_in("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _float_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _float_in("repetition_penalty", self.repetition_penalty, 0.0, FLOAT_CEIL, open_low=True)
        _int_in("priority", self.priority, -MAX_PRIORITY, MAX_PRIORITY)
        _int_in("n", self.n, 1, INT32_MAX)
        if self.best_of is not None:
            if self.best_of < self.n:
                raise ParamError("best_of", f"best_of must be >= n ({self.n}), got {self.best_of}")
            _int_in("best_of", self.best_of, 1, INT32_MAX)
        if self.pooling is not None and self.num_samples > 1:  # one prompt, one embedding
            raise ParamError(
                "pooling", f"pooling needs n = 1 and no best_of, got {self.num_samples} samples"
            )
        self._check_extras(vocab_size)
        if self.structured_outputs is not None:
            broken = self.structured_outputs.check()
            if broken is not None:
                name, message = broken
                raise ParamError(".".join(filter(None, ("structured_outputs", name))), message)
            if self.ignore_eos:
                # the grammar ends the text by allowing only EOS: ignoring it would run on
                raise ParamError(
                    "ignore_eos", "ignore_eos cannot be combined with structured output"
                )
            # the grammar may allow only the tokens these forbid: no token left
            for name in ("min_tokens", "allowed_token_ids", "bad_words"):
                if getattr(self, name):
                    raise ParamError(name, f"{name} cannot be combined with structured output")

    def _check_bans(self, vocab_size: int | None) -> None:
        """allowed_token_ids, bad_words (and their token ids) and truncate_prompt_tokens."""
        limit = vocab_size if vocab_size is not None else INT32_MAX + 1
        allowed = self.allowed_token_ids
        if allowed is not None:
            if not allowed:
                raise ParamError("allowed_token_ids", "allowed_token_ids must not be empty")
            if len(allowed) > MAX_ALLOWED_TOKEN_IDS:
                raise ParamError(
                    "allowed_token_ids",
                    f"allowed_token_ids holds at most {MAX_ALLOWED_TOKEN_IDS} ids, "
                    f"got {len(allowed)}",
                )
            for token_id in allowed:
                if not 0 <= token_id < limit:
                    raise ParamError(
                        "allowed_token_ids",
                        f"allowed_token_ids holds {token_id}, outside the vocabulary [0, {limit})",
                    )
        words = self.bad_words or ()
        if len(words) > MAX_BAD_WORDS:
            raise ParamError(
                "bad_words", f"bad_words holds at most {MAX_BAD_WORDS} words, got {len(words)}"
            )
        if any(not w.strip() for w in words):
            raise ParamError("bad_words", "bad_words must not hold empty or blank words")
        num_ids = sum(map(len, self.bad_words_token_ids))
        if num_ids > MAX_BAD_WORDS_TOKENS:
            raise ParamError(
                "bad_words",
                f"bad_words encode to {num_ids} tokens; at most {MAX_BAD_WORDS_TOKENS}",
            )
        for word in self.bad_words_token_ids:
            if not word or not all(0 <= t < limit for t in word):
                raise ParamError(
                    "bad_words", f"bad_words token ids {word} are not all in [0, {limit})"
                )
        self._check_thinking(limit)
        k = self.truncate_prompt_tokens
        if k is not None and not (k == -1 or 1 <= k <= INT32_MAX):
            raise ParamError(
                "truncate_prompt_tokens",
                f"truncate_prompt_tokens must be an integer >= 1 or -1, got {k}",
            )

    def _check_thinking(self, limit: int) -> None:
        """thinking_token_budget, its tags and their token ids."""
        budget, tags, ids = self.thinking_token_budget, self.thinking_tags, self.thinking_ids
        if budget is not None:  # its tags: the tokenizer actor's check, where they are read
            _int_in("thinking_token_budget", budget, 0, INT32_MAX)
        if tags is not None and not all(tag.strip() for tag in tags):
            raise ParamError("thinking_tags", "thinking_tags must be two non-blank texts")
        if ids is not None:
            for name, part in (("start", ids.start), ("end", ids.end)):
                if not 1 <= len(part) <= MAX_TAG_TOKENS or not all(0 <= t < limit for t in part):
                    raise ParamError(
                        "thinking_tags",
                        f"thinking_tags' {name} encodes to {len(part)} token ids; expected 1 "
                        f"to {MAX_TAG_TOKENS}, each in [0, {limit})",
                    )

    def _check_extras(self, vocab_size: int | None) -> None:
        """logit_bias, min_tokens, the bans, the streaming window, the adapter and salt."""
        self._check_bans(vocab_size)
        for name, limit in (("lora", 128), ("cache_salt", MAX_CACHE_SALT_CHARS)):
            value = getattr(self, name)
            if value is not None and not 1 <= len(value) <= limit:
                raise ParamError(name, f"{name} must be 1 to {limit} characters, got {len(value)}")
        for name in ("streaming_window", "sink_tokens"):
            value = getattr(self, name)
            if value is not None:
                _int_in(name, value, 0, INT32_MAX)
        if self.is_streaming and self.num_samples > 1:
            # samples would share blocks that each one's window then releases at its own pace
            field = "n" if self.best_of is None else "best_of"
            raise ParamError(field, f"{field} must be 1 with streaming_window (StreamingLLM)")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ParamError(
                "min_tokens",
                f"min_tokens must be in [0, max_tokens = {self.max_tokens}], got {self.min_tokens}",
            )
        if self.logit_bias is None:
            return
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise ParamError(
                "logit_bias",
                f"logit_bias holds at most {MAX_LOGIT_BIAS} tokens, got {len(self.logit_bias)}",
            )
        limit = vocab_size if vocab_size is not None else INT32_MAX + 1
        for token_id, bias in self.logit_bias.items():
            if not 0 <= token_id < limit:
                raise ParamError(
                    "logit_bias", f"logit_bias token id {token_id} is outside [0, {limit})"
                )
            if not (math.isfinite(bias) and -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT):
                raise ParamError(
                    "logit_bias",
                    f"logit_bias[{token_id}] must be in [-{LOGIT_BIAS_LIMIT:g}, "
                    f"{LOGIT_BIAS_LIMIT:g}], got {bias!r}",
                )


INT32_MAX = 2**31 - 1
MAX_PRIORITY = INT32_MAX  # |priority| bound: it is compared, never used as an index
MAX_STOP_STRINGS = 16
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range; a bias applies to the raw logit, so it is float32-safe
MAX_LOGIT_BIAS = 1024  # entries per request: bounds the per-step scatter on the device
MAX_STOP_CHARS = 512
MAX_ALLOWED_TOKEN_IDS = 1024  # per request, as logit_bias: bounds the per-step scatter
# vLLM's limits (v1 worker's bad-words state): words per request, and their tokens in all
MAX_BAD_WORDS = 128
MAX_BAD_WORDS_TOKENS = 1024
MAX_CACHE_SALT_CHARS = 256
MAX_TAG_TOKENS = 32  # a thinking tag's token ids: the executor matches them at every step
# Floats go to the device as float32: a nonzero magnitude below FLOAT_FLOOR would flush to 0
# there (top_p 1e-300 would become 0, which means something else), and dividing logits by it
# would overflow; one above FLOAT_CEIL would become inf. Both are rejected, not clamped.
FLOAT_FLOOR = 1e-30
FLOAT_CEIL = 1e30
_PATH = re.compile(r" - at `(?:key` in `)?\$\.([A-Za-z_]\w*).*`$")


def _int_in(field: str, value: int, low: int, high: int) -> None:
    if value < low:
        raise ParamError(field, f"{field} must be >= {low}, got {value}")
    if value > high:
        raise ParamError(field, f"{field} must be <= {high}, got {value}")


def _float_in(
    field: str,
    value: float,
    low: float,
    high: float,
    *,
    open_low: bool = False,
) -> None:
    """`value` in [low, high] (or (low, high]), and 0 or of a float32-safe magnitude."""
    above_low = low < value if open_low else low <= value
    if not (math.isfinite(value) and above_low and value <= high):
        bracket = "(" if open_low else "["
        raise ParamError(field, f"{field} must be in {bracket}{low:g}, {high:g}], got {value!r}")
    if value != 0.0 and not FLOAT_FLOOR <= abs(value) <= FLOAT_CEIL:
        raise ParamError(
            field,
            f"{field} = {value!r} would not survive float32 math: use 0 or a magnitude in "
            f"[{FLOAT_FLOOR:g}, {FLOAT_CEIL:g}]",
        )
