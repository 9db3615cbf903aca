"""The model's default sampling parameters, read once at the engine's start (vLLM's
`--generation-config` and `--override-generation-config`): the one owner of "the defaults a
request gets" (messages/sampling_defaults.SamplingDefaults).

    generation_config="auto"   the model's own: an HF folder's generation_config.json, or a
                               GGUF file's general.sampling.* keys (llama.cpp's)
    generation_config="vllm"   none: SamplingParams' neutral defaults
    generation_config=PATH     that folder's generation_config.json (or that .json file)

then `override_generation_config`'s keys on top (in every mode, as vLLM). Only the keys vLLM
reads count (GENERATION_CONFIG_KEYS): temperature, top_p, top_k, min_p, repetition_penalty and
max_new_tokens. A value SamplingParams would refuse is a ConfigError naming the file, at start
rather than in every request.
"""

from __future__ import annotations

import json
from pathlib import Path

import structlog
from troupe.config import ConfigError, EngineConfig, resolve_model_path
from troupe.gguf_file import GGUFFormatError, read_gguf_metadata
from troupe.messages.sampling import ParamError
from troupe.messages.sampling_defaults import SamplingDefaults

log = structlog.get_logger("troupe.engine")

GENERATION_CONFIG_FILE = "generation_config.json"
# llama.cpp's sampling keys (gguf-py's Keys.General.SAMPLING_*) -> generation_config's names
_GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


def read_sampling_defaults(config: EngineConfig) -> SamplingDefaults:
    """The defaults `config` gives its requests (blocking: small reads, a GGUF's metadata);
    logs them. ConfigError naming the field when the file cannot be read or holds a value
    SamplingParams refuses."""
    source, fields = _model_fields(config)
    # override's keys and values were checked by EngineConfig: what fails now is the file's
    override = config.override_generation_config or {}
    try:
        defaults = SamplingDefaults.from_generation_config({**fields, **override})
    except ParamError as exc:
        raise ConfigError(
            f"generation_config: {source}: {exc} (generation_config='vllm' ignores the file; "
            "override_generation_config sets a value)"
        ) from None
    # once per start, as vLLM says it: what every request that leaves a field unset gets
    applied = defaults.as_kwargs() or "none"
    log.info("sampling defaults", applied=applied, source=source, overridden=sorted(override))
    return defaults


def _model_fields(config: EngineConfig) -> tuple[str, dict[str, object]]:
    """(where the defaults come from, their generation_config keys)."""
    if config.generation_config == "vllm":
        return "generation_config='vllm'", {}
    if config.generation_config != "auto":
        path = Path(config.generation_config).expanduser()
        file = path / GENERATION_CONFIG_FILE if path.is_dir() else path
        if not file.is_file():
            raise ConfigError(
                f"generation_config: {str(path)!r} is neither a folder with "
                f"{GENERATION_CONFIG_FILE} nor such a file ('auto': the model's, 'vllm': none)"
            )
        return str(file), _read_json(file)
    model = resolve_model_path(config.model)
    if model.is_file():  # a GGUF file: llama.cpp's sampling keys, when the converter wrote them
        try:
            metadata = read_gguf_metadata(model)
        except GGUFFormatError:
            return str(model), {}  # the loader names what is wrong with the file
        fields = {name: metadata[key] for key, name in _GGUF_KEYS.items() if key in metadata}
        return str(model), {k: _float32(v) for k, v in fields.items()}
    file = model / GENERATION_CONFIG_FILE
    return str(file), _read_json(file) if file.is_file() else {}


def _read_json(file: Path) -> dict[str, object]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"generation_config: cannot read {file}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"generation_config: {file} must hold a JSON object")
    return data


def _float32(value: object) -> object:
    """A GGUF float32 as the decimal it was written from (0.949999988 -> 0.95)."""
    return float(f"{value:.7g}") if isinstance(value, float) else value
