"""The speculators format (the `speculators` library's, which vLLM loads): an EAGLE head's
config.json that nests the draft layers' config and says how the head was trained to propose.

    {"speculators_model_type": "eagle3",            ("eagle": an EAGLE-1 head)
     "architectures": ["Eagle3Speculator"],
     "transformer_layer_config": {...},              the draft layers' Llama/Qwen config
     "draft_vocab_size": 32000, "norm_before_residual": true, "target_hidden_size": 4096,
     "eagle_aux_hidden_state_layer_ids": [2, 16, 29],
     "speculators_config": {"algorithm": "eagle3",
         "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
         "default_proposal_method": "greedy",
         "verifier": {"name_or_path": "meta-llama/...", "architectures": ["LlamaForCausalLM"]}}}

Here only what EngineConfig reads, as JSON: the count of proposals the head was trained for,
num_speculative_tokens when the config sets none (as vLLM takes it). gpu/eagle_speculators.py
maps the rest onto the plain EAGLE layouts that gpu/eagle_load.py reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from troupe.config_checks import ConfigError

SPECULATORS_TYPES = ("eagle", "eagle3")  # the speculators_model_type values troupe loads
MAX_SPECULATIVE_TOKENS = 16
DEFAULT_SPECULATIVE_TOKENS = 4
_COUNT = "speculators_config.proposal_methods[0].speculative_tokens"


def speculators_fields(folder: Path) -> dict[str, Any] | None:
    """config.json of a head folder in the speculators format (it names speculators_model_type);
    None for any other folder or path (one that does not exist or holds no readable JSON too:
    its loader says what is wrong with it)."""
    try:
        fields = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(fields, dict) or "speculators_model_type" not in fields:
        return None
    return fields


def proposal_count(fields: dict[str, Any]) -> int | None:
    """The speculative_tokens of the first proposal method (vLLM reads that one); None when
    the config gives none."""
    spec = fields.get("speculators_config")
    methods = spec.get("proposal_methods") if isinstance(spec, dict) else None
    if not isinstance(methods, list) or not methods or not isinstance(methods[0], dict):
        return None
    count = methods[0].get("speculative_tokens")
    if count is None:
        return None
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError(
            f"draft_model config.json: {_COUNT} must be an integer >= 1, got {count!r}"
        )
    return count


def resolve_speculative_tokens(
    given: int | None, method: str | None, draft_model: str | None
) -> int:
    """num_speculative_tokens: as given; else, for an EAGLE head in the speculators format, the
    count its speculators_config proposes (vLLM's default); else 4. Checked: 1..16."""
    if given is None:
        fields = None
        if method in ("eagle", "eagle3") and draft_model:
            fields = speculators_fields(Path(draft_model).expanduser())
        count = None if fields is None else proposal_count(fields)
        if count is not None and count > MAX_SPECULATIVE_TOKENS:
            raise ConfigError(
                f"draft_model config.json: {_COUNT} is {count}, more than the "
                f"{MAX_SPECULATIVE_TOKENS} a step verifies; set num_speculative_tokens"
            )
        given = DEFAULT_SPECULATIVE_TOKENS if count is None else count
    if not isinstance(given, int) or isinstance(given, bool) or given < 1:
        raise ConfigError(f"num_speculative_tokens must be an integer >= 1, got {given!r}")
    if given > MAX_SPECULATIVE_TOKENS:
        raise ConfigError(
            f"num_speculative_tokens must be <= {MAX_SPECULATIVE_TOKENS}, got {given}"
        )
    return given
