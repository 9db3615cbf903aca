"""Build a `TextTokenizer` from the tokenizer metadata of a GGUF file.

`tokenizer.ggml.model == "gpt2"` (byte-level BPE: the family of SmolLM2, Llama 3, Qwen2/3 and
DeepSeek), and "llama" (sentencepiece) for the Gemma architectures (actors/core/tokenizer_spm.py).
The pre-tokenizer follows llama.cpp's `tokenizer.ggml.pre` names, split the way the model's
original tokenizer.json splits (actors/core/tokenizer_gguf_pre.py).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, processors
from troupe.actors.core.tokenizer_gguf_pre import gguf_pre_tokenizer
from troupe.actors.core.tokenizer_spm import gemma_tokenizer, user_defined_kept
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.gguf_file import MetadataValue, read_gguf_metadata

# GGUF token types (llama.cpp's llama_token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

_SPM_ARCHS = ("gemma", "gemma2", "gemma3")  # sentencepiece files whose merges we rebuild


def load_gguf_tokenizer(path: Path) -> TextTokenizer:
    """The tokenizer stored in the GGUF file at `path`. Raises ValueError naming the file and
    the metadata key when something is missing or unsupported."""
    meta = read_gguf_metadata(path)
    kind = _get(meta, path, "tokenizer.ggml.model")
    arch = meta.get("general.architecture")
    spm = kind == "llama" and arch in _SPM_ARCHS
    if kind != "gpt2" and not spm:
        raise ValueError(
            f"{path}: tokenizer.ggml.model is {kind!r} (architecture {arch!r}); supported: "
            f"'gpt2' (byte-level BPE), and 'llama' for {', '.join(_SPM_ARCHS)} "
            "(use the model's HF folder instead)"
        )
    tokens = _str_list(meta, path, "tokenizer.ggml.tokens")
    token_types = meta.get("tokenizer.ggml.token_type")
    if not isinstance(token_types, list) or len(token_types) != len(tokens):
        token_types = [_NORMAL] * len(tokens)
    if spm:
        tokenizer = gemma_tokenizer(tokens)
        added = [
            i
            for i, kind in enumerate(token_types)
            if kind == _CONTROL
            or (kind == _USER_DEFINED and user_defined_kept(tokens[i], tokenizer))
        ]
    else:
        tokenizer = _byte_level(meta, path, tokens)
        added = [i for i, kind in enumerate(token_types) if kind in (_CONTROL, _USER_DEFINED)]
    # Control tokens are special (skipped on decode); user-defined ones are plain added tokens.
    tokenizer.add_tokens(
        [AddedToken(tokens[i], special=token_types[i] == _CONTROL, normalized=False) for i in added]
    )
    return _text_tokenizer(meta, path, tokens, tokenizer)


def _byte_level(meta: dict[str, MetadataValue], path: Path, tokens: list[str]) -> Tokenizer:
    """Byte-level BPE from the file's tokens and merges, split as `tokenizer.ggml.pre` says."""
    merges = _str_list(meta, path, "tokenizer.ggml.merges")
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise ValueError(f"{path}: tokenizer.ggml.merges entry {merge!r} is not 'left right'")
        pairs.append((left, right))
    tokenizer = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    pre = meta.get("tokenizer.ggml.pre", "default")
    tokenizer.pre_tokenizer = gguf_pre_tokenizer(pre, path)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _text_tokenizer(
    meta: dict[str, MetadataValue], path: Path, tokens: list[str], tokenizer: Tokenizer
) -> TextTokenizer:
    """The TextTokenizer around `tokenizer`: BOS/EOS template, stop ids, chat template."""
    bos_id = _optional_id(meta, "tokenizer.ggml.bos_token_id", len(tokens))
    eos_id = _optional_id(meta, "tokenizer.ggml.eos_token_id", len(tokens))
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos_id is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos_id is not None
    if add_bos or add_eos:
        tokenizer.post_processor = _bos_eos_processor(
            tokens, bos_id if add_bos else None, eos_id if add_eos else None
        )
    eos_ids = [eos_id] if eos_id is not None else []
    eot_id = _optional_id(meta, "tokenizer.ggml.eot_token_id", len(tokens))
    if eot_id is not None and eot_id not in eos_ids:
        eos_ids.append(eot_id)
    template = meta.get("tokenizer.chat_template")
    unk_id = _optional_id(meta, "tokenizer.ggml.unknown_token_id", len(tokens))
    pad_id = _optional_id(meta, "tokenizer.ggml.padding_token_id", len(tokens))
    return TextTokenizer(
        tokenizer,
        source=str(path),
        bos_token_id=bos_id,
        eos_token_ids=tuple(eos_ids),
        chat_template=template if isinstance(template, str) else None,
        unk_token=tokens[unk_id] if unk_id is not None else None,
        pad_token=tokens[pad_id] if pad_id is not None else None,
    )


def _bos_eos_processor(
    tokens: list[str], bos_id: int | None, eos_id: int | None
) -> processors.TemplateProcessing:
    single, pair, special = ["$A"], ["$A", "$B"], []
    if bos_id is not None:
        single, pair = [tokens[bos_id], *single], [tokens[bos_id], "$A", tokens[bos_id], "$B"]
        special.append((tokens[bos_id], bos_id))
    if eos_id is not None:
        single.append(tokens[eos_id])
        pair = [*pair[: pair.index("$B")], tokens[eos_id], "$B", tokens[eos_id]]
        special.append((tokens[eos_id], eos_id))
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


def _get(meta: dict[str, MetadataValue], path: Path, key: str) -> MetadataValue:
    if key not in meta:
        raise ValueError(f"{path}: GGUF metadata has no {key!r}: the file carries no tokenizer")
    return meta[key]


def _str_list(meta: dict[str, MetadataValue], path: Path, key: str) -> list[str]:
    value = _get(meta, path, key)
    if not isinstance(value, list):
        raise ValueError(f"{path}: GGUF metadata {key!r} is not an array")
    out: list[str] = []
    for item in value:
        if isinstance(item, bytes):  # byte-level BPE token texts are ASCII-safe; be lenient
            item = item.decode("utf-8", "replace")
        if not isinstance(item, str):
            raise ValueError(f"{path}: GGUF metadata {key!r} holds a non-string {item!r}")
        out.append(item)
    return out


def _optional_id(meta: dict[str, MetadataValue], key: str, vocab_size: int) -> int | None:
    value = meta.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size:
        return value
    return None
