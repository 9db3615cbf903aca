"""The pre-tokenizer a GGUF file names in `tokenizer.ggml.pre`, as HF `tokenizers` objects.

The names are llama.cpp's (src/llama-vocab.cpp maps each to a LLAMA_VOCAB_PRE_TYPE_* and a list
of split regexes). Where llama.cpp's list differs from the tokenizer.json the model shipped with,
we follow the original, so that text splits the way the model was trained:

- "smollm" and friends: Digits(individual) then GPT-2's byte-level regex (transformers' own GGUF
  loader drops the digit split; llama.cpp and SmolLM2's tokenizer.json keep it).
- "deepseek-llm" (DeepSeek-LLM, DeepSeek-V2 and Coder-V2) and "deepseek-coder" (DeepSeek-Coder
  v1): DeepSeek's tokenizer.json is a Sequence of isolating Splits, then Digits(individual),
  then ByteLevel without its regex. llama.cpp writes the digit step as `\\p{N}+` for
  deepseek-llm (the same ids wherever the vocabulary has no merge of two digits, as a
  vocabulary trained on single digits should not).
  llama.cpp's source also carries six letters of the deepseek-llm letter class NFC-normalised
  (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A became their singleton equivalents, which
  turns three ranges upside down); the class below is written by code point, as shipped.
- "deepseek-v3" (DeepSeek-V3 / R1; "joyai-llm" is the name newer llama.cpp conversions of the
  same tokenizer get): three isolating Splits, then ByteLevel without its regex.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, pre_tokenizers

LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# DeepSeek-LLM's cased-letter class, (first, last) code points.
_DEEPSEEK_LETTERS = (
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA),
    (0x1BC, 0x1BF), (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377),
    (0x37B, 0x37D), (0x37F, 0x37F), (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C),
    (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481), (0x48A, 0x52F), (0x531, 0x556),
    (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA), (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D), (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE),
    (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC),
    (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102), (0x2107, 0x2107), (0x210A, 0x2113),
    (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126), (0x2128, 0x2128),
    (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE),
    (0x2CF2, 0x2CF3), (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787),
    (0xA78B, 0xA78E), (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3), (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943),
)  # fmt: skip
# ASCII punctuation, fullwidth punctuation, curly quotes, ideographic space / comma / full stop.
_DEEPSEEK_PUNCT = ((0x21, 0x2F), (0x3A, 0x7E), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E),
                   (0x2018, 0x201F), (0x3000, 0x3002))  # fmt: skip
# CJK ideographs, U+0800..U+4E00 (Samaritan up to CJK, kana included), Hangul syllables.
_DEEPSEEK_CJK = ((0x4E00, 0x9FA5), (0x0800, 0x4E00), (0xAC00, 0xD7FF))
# DeepSeek-V3: CJK ideographs, hiragana, katakana.
_DEEPSEEK_V3_CJK = ((0x4E00, 0x9FA5), (0x3040, 0x309F), (0x30A0, 0x30FF))
_DEEPSEEK_V3_REGEX = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _char_class(ranges: tuple[tuple[int, int], ...]) -> str:
    """A regex character class of the code point ranges (onig's \\x{...} escapes)."""
    parts = [f"\\x{{{lo:X}}}" if lo == hi else f"\\x{{{lo:X}}}-\\x{{{hi:X}}}" for lo, hi in ranges]
    return "[" + "".join(parts) + "]"


def _splits_then_bytes(regexes: list[str], *, digits: bool = False) -> pre_tokenizers.PreTokenizer:
    """Isolating splits in order, optionally single digits, then the byte-level alphabet."""
    steps: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in regexes
    ]
    if digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def _deepseek_llm() -> pre_tokenizers.PreTokenizer:
    return _splits_then_bytes(
        [
            r"[\r\n]",
            r"\s?" + _char_class(_DEEPSEEK_LETTERS) + "+",
            r"\s?" + _char_class(_DEEPSEEK_PUNCT) + "+",
            r"\s+$",
            _char_class(_DEEPSEEK_CJK) + "+",
        ],
        digits=True,
    )


def _deepseek_coder() -> pre_tokenizers.PreTokenizer:
    return _splits_then_bytes(
        [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _char_class(_DEEPSEEK_CJK) + "+"], digits=True
    )


def _deepseek_v3() -> pre_tokenizers.PreTokenizer:
    return _splits_then_bytes(
        [r"\p{N}{1,3}", _char_class(_DEEPSEEK_V3_CJK) + "+", _DEEPSEEK_V3_REGEX]
    )


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _llama3() -> pre_tokenizers.PreTokenizer:
    return _splits_then_bytes([LLAMA3_REGEX])


def _qwen2() -> pre_tokenizers.PreTokenizer:
    return _splits_then_bytes([QWEN2_REGEX])


_BUILDERS = {
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell"), _digits_then_gpt2),
    **dict.fromkeys(("gpt2", "default", "mpt", "olmo"), _gpt2),
    **dict.fromkeys(("llama-bpe", "llama3"), _llama3),
    "qwen2": _qwen2,
    "deepseek-llm": _deepseek_llm,
    "deepseek-coder": _deepseek_coder,
    **dict.fromkeys(("deepseek-v3", "joyai-llm"), _deepseek_v3),
}
SUPPORTED_PRE = tuple(sorted(_BUILDERS))


def gguf_pre_tokenizer(pre: object, path: Path) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer for `tokenizer.ggml.pre` value `pre` (a missing key means "default").
    Raises ValueError naming the file and the supported names."""
    build = _BUILDERS.get(pre) if isinstance(pre, str) else None
    if build is None:
        raise ValueError(
            f"{path}: tokenizer.ggml.pre {pre!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_PRE)})"
        )
    return build()
