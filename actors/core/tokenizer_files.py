"""Find and load a model's tokenizer: an HF folder (tokenizer.json + tokenizer_config.json) or
a GGUF file.

Every failure is a `TokenizerLoadError` whose message names the file at fault.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from troupe.actors.core.tokenizer_gguf import load_gguf_tokenizer
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.gguf_file import GGUFFormatError


class TokenizerLoadError(ValueError):
    """The tokenizer files are missing or malformed; the message names the file."""


def load_tokenizer(
    model_path: str | Path | None = None,
    chat_template: str | None = None,
    template_defaults: str | None = None,
) -> TextTokenizer:
    """The tokenizer of the model at `model_path` (folder or .gguf); None: the default model.
    `chat_template` (EngineConfig's): a .jinja file or a template's text used instead of the
    model's own. `template_defaults`: EngineConfig.template_defaults_json, the template's
    variables where a request leaves them out."""
    tokenizer = _load(model_path)
    if chat_template is not None:
        tokenizer.chat_template = chat_template_text(chat_template)
    if template_defaults is not None:
        tokenizer.template_defaults = json.loads(template_defaults)
    return tokenizer


def chat_template_text(value: str) -> str:
    """EngineConfig.chat_template's text: a file's contents, or the value itself when it is a
    template (it has `{{` or `{%`); else a TokenizerLoadError naming the knob."""
    path = Path(value).expanduser()
    if "\n" not in value and len(value) < 4096 and path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerLoadError(f"chat_template: cannot read {path}: {exc}") from exc
    if "{{" in value or "{%" in value:
        return value
    raise TokenizerLoadError(
        f"chat_template: {value!r} is neither a file nor a template (no '{{{{' or '{{%')"
    )


def _load(model_path: str | Path | None) -> TextTokenizer:
    if model_path is None:
        from troupe.config import default_model_path

        model_path = default_model_path()
    path = Path(model_path).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise TokenizerLoadError(
                f"{path}: expected a .gguf file or a model folder with tokenizer.json"
            )
        try:
            return load_gguf_tokenizer(path)
        except (GGUFFormatError, ValueError, OSError) as exc:
            raise TokenizerLoadError(str(exc)) from exc
    if path.is_dir():
        return _load_hf_folder(path)
    raise TokenizerLoadError(f"{path}: no such model file or folder")


def _load_hf_folder(folder: Path) -> TextTokenizer:
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise TokenizerLoadError(
            f"{tokenizer_file}: missing (only fast tokenizers, saved as tokenizer.json, load)"
        )
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:  # the Rust side raises plain Exception on a bad file
        raise TokenizerLoadError(f"{tokenizer_file}: not a valid tokenizer file ({exc})") from exc
    config = _read_json(folder / "tokenizer_config.json")

    bos_id = _token_id(tokenizer, config.get("bos_token"), folder / "tokenizer_config.json")
    eos_ids: list[int] = []
    eos_id = _token_id(tokenizer, config.get("eos_token"), folder / "tokenizer_config.json")
    if eos_id is not None:
        eos_ids.append(eos_id)
    # Instruct models often end a turn with a token other than eos_token (Llama 3's <|eot_id|>);
    # generation_config.json lists all of them, config.json sometimes does.
    for name in ("generation_config.json", "config.json"):
        value = _read_json(folder / name).get("eos_token_id")
        for token_id in value if isinstance(value, list) else [value]:
            if isinstance(token_id, int) and token_id not in eos_ids:
                eos_ids.append(token_id)
    if bos_id is None:
        value = _read_json(folder / "config.json").get("bos_token_id")
        bos_id = value if isinstance(value, int) else None

    return TextTokenizer(
        tokenizer,
        source=str(folder),
        bos_token_id=bos_id,
        eos_token_ids=tuple(eos_ids),
        chat_template=_chat_template(folder, config),
        unk_token=_token_text(config.get("unk_token")),
        pad_token=_token_text(config.get("pad_token")),
    )


def _chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    """The template from chat_template.jinja, chat_template.json or tokenizer_config.json."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = _read_json(folder / "chat_template.json").get("chat_template")
    if template is None:
        template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise TokenizerLoadError(f"{folder / 'tokenizer_config.json'}: chat_template is not text")
    return template


def _read_json(file: Path) -> dict[str, Any]:
    """The JSON object in `file`, or {} when it does not exist."""
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenizerLoadError(f"{file}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_text(value: object) -> str | None:
    # tokenizer_config.json writes special tokens as a string or as a serialized AddedToken.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _token_id(tokenizer: Tokenizer, value: object, file: Path) -> int | None:
    text = _token_text(value)
    if text is None:
        return None
    token_id = tokenizer.token_to_id(text)
    if token_id is None:
        raise TokenizerLoadError(f"{file}: special token {text!r} is not in the vocabulary")
    return int(token_id)
