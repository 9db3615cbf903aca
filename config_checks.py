"""EngineConfig's checks of features that combine with only some others: ConfigError, and the
rules of prefill/decode disaggregation, of LoRA adapters and of the generation config's
sampling defaults (config.py calls them)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from troupe.messages.sampling import ParamError
from troupe.messages.sampling_defaults import GENERATION_CONFIG_KEYS, SamplingDefaults

if TYPE_CHECKING:
    from troupe.config import EngineConfig


class ConfigError(ValueError):
    """A config field is invalid; the message names it."""


# What prefill/decode disaggregation does not combine with: (field, the value it needs)
_DISAGGREGATION_NEEDS: tuple[tuple[str, object], ...] = (
    ("runner", "model"), ("tensor_parallel_size", 1), ("speculative_method", None),
    ("streaming_window", 0), ("kv_cache_dtype", "auto"), ("prefix_cache_cpu_tier", False),
    ("trace_path", None), ("lora_modules", ()), ("enable_lora", False),
)  # fmt: skip


def check_needs(
    config: EngineConfig,
    needs: tuple[tuple[str, object], ...],
    feature: str,
    why: str = "not supported together",
) -> None:
    """ConfigError naming the first field of `needs` (field, the value it needs) that `config`
    sets otherwise, `feature` (e.g. "disaggregation 'prefill_decode'") being what needs it."""
    for name, needed in needs:
        if getattr(config, name) != needed:
            raise ConfigError(
                f"{name} must be {needed!r} with {feature} ({why}), got {getattr(config, name)!r}"
            )


def check_disaggregation(config: EngineConfig) -> None:
    """ConfigError naming the first field prefill/decode disaggregation cannot serve."""
    check_needs(config, _DISAGGREGATION_NEEDS, f"disaggregation {config.disaggregation!r}")
    if config.preemption_mode == "swap":  # each side's pool would need its own CPU pool
        raise ConfigError(
            f"preemption_mode must be 'auto' or 'recompute' with disaggregation "
            f"{config.disaggregation!r} (preempted requests are recomputed), got 'swap'"
        )
    for name in ("prefill_device_index", "decode_device_index"):
        value = getattr(config, name)
        if not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")


def check_positive(config: EngineConfig, *names: str) -> None:
    """Each named field is an integer >= 1."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


def check_speculative(config: EngineConfig) -> None:
    """The speculative-decoding fields: num_speculative_tokens resolved to an int, counts,
    overheads and rates in range, the draft's source."""
    from troupe.speculators_format import resolve_speculative_tokens  # it imports this module

    k = resolve_speculative_tokens(
        config.num_speculative_tokens, config.speculative_method, config.draft_model
    )  # an int from here on (speculators_format.py)
    object.__setattr__(config, "num_speculative_tokens", k)
    check_positive(
        config,
        "prompt_lookup_min",
        "prompt_lookup_max",
        "speculative_backoff_steps",
        "speculative_step_fixed_tokens",
    )
    if config.prompt_lookup_min > config.prompt_lookup_max:
        raise ConfigError(
            f"prompt_lookup_min ({config.prompt_lookup_min}) must be <= prompt_lookup_max "
            f"({config.prompt_lookup_max})"
        )
    size = config.speculative_disable_by_batch_size
    if size is not None and (not isinstance(size, int) or size < 1):
        raise ConfigError(
            f"speculative_disable_by_batch_size must be an integer >= 1 or None, got {size!r}"
        )
    for name in ("speculative_verify_overhead", "speculative_draft_overhead"):
        value = getattr(config, name)
        if not isinstance(value, int | float) or not 0.0 <= value <= 100.0:
            raise ConfigError(f"{name} must be a number in [0, 100], got {value!r}")
    if not 0.0 <= config.speculative_min_acceptance <= 1.0:
        raise ConfigError(
            "speculative_min_acceptance must be in [0, 1], "
            f"got {config.speculative_min_acceptance!r}"
        )
    check_draft_source(config)


def check_draft_source(config: EngineConfig) -> None:
    """ConfigError when draft_model and speculative_method do not go together: "draft_model"
    and "eagle"/"eagle3" need draft_model (a draft model; an EAGLE head's folder), the others
    none ("mtp" reads the model's own layer). vLLM's "deepseek_mtp" is taken as "mtp"."""
    if config.speculative_method == "deepseek_mtp":
        object.__setattr__(config, "speculative_method", "mtp")
    method = config.speculative_method
    if method == "mtp" and config.draft_model is not None:
        raise ConfigError(
            "draft_model must be unset with speculative_method 'mtp' (the multi-token-"
            f"prediction layer is read from the model's own folder), got {config.draft_model!r}"
        )
    if config.executor_proposes:
        if not config.draft_model and method != "mtp":
            what = "a path to a smaller model of the same vocabulary"
            if method in ("eagle", "eagle3"):
                what = "an EAGLE head's HF folder"
            raise ConfigError(f"speculative_method {method!r} needs draft_model ({what})")
        if config.runner == "fake":
            raise ConfigError(f"speculative_method {method!r} needs runner='model'")
        if method in ("eagle", "eagle3", "mtp") and config.tensor_parallel_size != 1:
            raise ConfigError(
                f"tensor_parallel_size must be 1 with speculative_method {method!r} (the head reads "
                f"the unsharded model's hidden states), got {config.tensor_parallel_size}"
            )
    elif config.draft_model is not None:
        raise ConfigError(
            "draft_model is set but speculative_method is not 'draft_model', 'eagle' or 'eagle3'"
        )


# An adapter's name: what a request sends as SamplingParams.lora or as its HTTP `model` ('#'
# never: a reloaded adapter runs inside the engine as name#2, actors/lora_registry.py)
LORA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
LORA_NAME_RULE = (
    "1-128 characters of letters, digits and . _ : / - (starting with a letter or digit)"
)
MAX_LORA_RANK = 512


def check_lora(config: EngineConfig) -> None:
    """ConfigError naming the field when lora_modules, max_loras or max_lora_rank is invalid, or
    LoRA meets a feature it does not combine with."""
    if not isinstance(config.lora_modules, tuple):
        raise ConfigError(
            f"lora_modules must be a tuple of 'name=path' strings, got {config.lora_modules!r}"
        )
    names: set[str] = set()
    for entry in config.lora_modules:
        name, sep, path = entry.partition("=") if isinstance(entry, str) else ("", "", "")
        if not sep or not path:
            raise ConfigError(f"lora_modules entries are 'name=path', got {entry!r}")
        if not LORA_NAME.fullmatch(name):
            raise ConfigError(f"lora_modules: adapter name {name!r} must be {LORA_NAME_RULE}")
        if name in names:
            raise ConfigError(f"lora_modules: adapter name {name!r} is given twice")
        names.add(name)
    if not isinstance(config.max_loras, int) or config.max_loras < 1:
        raise ConfigError(f"max_loras must be an integer >= 1, got {config.max_loras!r}")
    rank = config.max_lora_rank
    if not isinstance(rank, int) or not 1 <= rank <= MAX_LORA_RANK:
        raise ConfigError(f"max_lora_rank must be an integer in [1, {MAX_LORA_RANK}], got {rank!r}")


def check_generation_config(config: EngineConfig) -> None:
    """ConfigError naming generation_config or override_generation_config: the mode is "auto",
    "vllm" or a path; the override's keys are generation_config keys that set a sampling
    default, with values SamplingParams accepts."""
    mode = config.generation_config
    if not isinstance(mode, str) or not mode.strip():
        raise ConfigError(
            f"generation_config must be 'auto', 'vllm' or a folder's path, got {mode!r}"
        )
    override = config.override_generation_config
    if override is None:
        return
    if not isinstance(override, dict):
        raise ConfigError(
            f"override_generation_config must be a JSON object such as "
            f'{{"temperature": 0.5}}, got {override!r}'
        )
    for key in override:
        if key not in GENERATION_CONFIG_KEYS:
            raise ConfigError(
                f"override_generation_config: {key!r} is not a sampling default; "
                f"the keys are {', '.join(GENERATION_CONFIG_KEYS)}"
            )
    try:
        SamplingDefaults.from_generation_config(override)
    except ParamError as exc:
        raise ConfigError(f"override_generation_config: {exc}") from None


# What input embeddings (enable_prompt_embeds) do not combine with: (field, the value it needs).
# Each feeds prompts by token id somewhere the embeddings do not reach: another process's model
# (tensor parallelism, disaggregation), a proposer's own embedding of the prompt (speculative
# decoding), a runner without a model.
_PROMPT_EMBEDS_NEEDS: tuple[tuple[str, object], ...] = (
    ("runner", "model"), ("tensor_parallel_size", 1), ("disaggregation", "none"),
    ("speculative_method", None),
)  # fmt: skip


def check_prompt_embeds(config: EngineConfig) -> None:
    """ConfigError naming the first field that enable_prompt_embeds cannot serve with."""
    if not isinstance(config.enable_prompt_embeds, bool):
        raise ConfigError(
            f"enable_prompt_embeds must be a bool, got {config.enable_prompt_embeds!r}"
        )
    if not config.enable_prompt_embeds:
        return
    check_needs(config, _PROMPT_EMBEDS_NEEDS, "enable_prompt_embeds")


def check_chat_template(config: EngineConfig) -> None:
    """ConfigError naming chat_template (a file path or a template's text) or
    default_chat_template_kwargs (template_defaults_json's rule)."""
    template = config.chat_template
    if template is not None and (not isinstance(template, str) or not template.strip()):
        raise ConfigError(
            f"chat_template must be a file path or a template's text, got {template!r}"
        )
    template_defaults_json(config)


def template_defaults_json(config: EngineConfig) -> str | None:
    """default_chat_template_kwargs as JSON text (sorted keys: one text a choice, hashable for
    the tokenizer cache), or a ConfigError naming the knob: a JSON object with text keys."""
    value = config.default_chat_template_kwargs
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(
            "default_chat_template_kwargs must be a JSON object such as "
            f'{{"enable_thinking": false}}, got {value!r:.200}'
        )
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"default_chat_template_kwargs: not JSON: {exc}") from None
