"""DeepSeek's GGUF pre-tokenizers split text as DeepSeek's own tokenizer.json files do.

One tiny byte-level BPE vocabulary is trained here on the corpus below with no pre-tokenizer at
all, so its merges cross every boundary a pre-tokenizer may draw (letters into spaces, digit
runs, punctuation into letters, CJK into Latin, newlines): a split drawn in the wrong place
changes the ids. The vocabulary goes into a GGUF per `tokenizer.ggml.pre` name, and what
`load_tokenizer` builds from it must give the ids of an HF `tokenizers` Tokenizer with the same
vocabulary and the `pre_tokenizer` section DeepSeek ships (tests/fixtures/, written
independently of actors/core/tokenizer_gguf_pre.py: character classes as escaped characters,
not code point tables).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from troupe.actors.core.tokenizer_files import TokenizerLoadError, load_tokenizer
from troupe.actors.core.tokenizer_text import TextTokenizer

_FIXTURE = Path(__file__).parents[2] / "fixtures" / "deepseek_pre_tokenizers.json"
_NAMES = ("deepseek-llm", "deepseek-coder", "deepseek-v3")

CORPUS = [
    "Hello world! The year 2024 had 366 days; 1234567 is a long number.",
    "def f(x):\n    return x**2 + 10  # square\n\n\nclass A: pass\n",
    "价格是100元，我们明天见。这是一个测试句子！",
    "日本語のテキストとカタカナ、ひらがなも。東京タワーは333メートル。",
    "한국어 문장입니다. 서울은 1394년부터 수도였다.",
    "Ελληνικά: ώρα, Ωμέγα, ΐ Ί ῾ι ᾳ — Kelvin K, Ohm Ω, ι ώ ΐ Ί.",
    "Русский текст, числа 12 345 и 6789; ‘quotes’ “double” «guillemets».",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵 end.",
    "tabs\tand  double  spaces   and trailing spaces   \nnext line\r\nCRLF line  ",
    "mixed中文English混合123abc４５６ｆｕｌｌ　ｗｉｄｔｈ！＂",
    "combining e\u0301 a\u0308 and precomposed é ä; arabic ١٢٣ and roman Ⅻ, ²³ ½.",
    "हिन्दी पाठ और ไทย ข้อความ; עברית ו-العربية 2+2=4.",
    "x=[1,2,3];y={'a':1}; if(a&&b||!c){return -1;} // C++ <T>::f()",
    "   leading spaces, @user #tag $100.00 50% ~tilde `code` ^caret |pipe\\back",
    "...!!! ??? ---  ___ *** ### end\n\n\n   \n",
    "smile 😀   \nwave 👋\t\n🎉  ",
    # Six letters NFC would turn into others (U+1F7D, U+2126, U+212A, U+1FBE, U+1FD3, U+1FDB),
    # and quotes, ideographic punctuation and spaces next to symbols. DeepSeek-LLM's CJK split
    # takes all of U+0800..U+4E00, so a letter there shows only beside another such non-letter.
    "K\u1f7d\u03c1\u03b1 \u2126\u212a \u1fbe\u1fd3 \u1fdbx x\u1f7d \u212a\u2126",
    "\u1f7d\u20ac \u1fdb\u20ac \u201c\u20ac\u2019\u20ac \u2126\u20ac\u212a\u20ac \u00b5m \u037f\uff1a",
    "He said \u201c hi \u201d \u3002 ok \u2018 \u2019 \U0001f600\u201cx\u201d\u3001\u3000end",
]


@pytest.fixture(scope="module")
def trained() -> Tokenizer:
    """A byte-level BPE with a merge for every pair and triple of adjacent characters in the
    corpus (trained on those, unsplit), so a boundary drawn differently changes the ids."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=20_000,
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    windows = [line[i : i + n] for line in CORPUS for n in (2, 3) for i in range(len(line) - 1)]
    tokenizer.train_from_iterator(windows, trainer=trainer)
    return tokenizer


def _reference(trained: Tokenizer, name: str) -> Tokenizer:
    config = json.loads(trained.to_str())
    config["pre_tokenizer"] = json.loads(_FIXTURE.read_text())[name]
    return Tokenizer.from_str(json.dumps(config))


def _write_gguf(path: Path, trained: Tokenizer, pre: str) -> None:
    gguf = pytest.importorskip("gguf")
    model: dict[str, Any] = json.loads(trained.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    writer = gguf.GGUFWriter(str(path), "deepseek2")
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_string("tokenizer.ggml.pre", pre)
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_array("tokenizer.ggml.merges", merges)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def _load(tmp_path: Path, trained: Tokenizer, pre: str) -> TextTokenizer:
    path = tmp_path / f"{pre}.gguf"
    _write_gguf(path, trained, pre)
    return load_tokenizer(path)


def _texts() -> list[str]:
    return [*CORPUS, "".join(CORPUS), "  ", "\n", "9" * 10, "a  1", "¹²³ 一二三 abc123def"]


@pytest.mark.parametrize("name", _NAMES)
def test_gguf_pre_tokenizer_matches_deepseek_tokenizer_json(
    name: str, trained: Tokenizer, tmp_path: Path
) -> None:
    tok = _load(tmp_path, trained, name)
    reference = _reference(trained, name)
    for text in _texts():
        ids = tok.encode(text)
        assert ids == reference.encode(text, add_special_tokens=False).ids, (name, text)
        assert tok.decode(ids) == text


def test_the_corpus_tells_the_pre_tokenizers_apart(trained: Tokenizer, tmp_path: Path) -> None:
    """The comparison above can fail: each name splits the corpus differently from the others
    and from GPT-2's regex, and DeepSeek-LLM's single digits (its tokenizer.json's Digits step)
    differ from llama.cpp's `\\p{N}+` on a vocabulary with multi-digit merges, like this one."""
    names = (*_NAMES, "gpt2")
    encoded = {name: [_load(tmp_path, trained, name).encode(t) for t in CORPUS] for name in names}
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            assert encoded[first] != encoded[second], (first, second)
    config = json.loads(_reference(trained, "deepseek-llm").to_str())
    steps = config["pre_tokenizer"]["pretokenizers"]
    assert steps[-2] == {"type": "Digits", "individual_digits": True}
    steps[-2] = {"type": "Split", "pattern": {"Regex": r"\p{N}+"}, "behavior": "Isolated"}
    steps[-2]["invert"] = False
    digit_runs = Tokenizer.from_str(json.dumps(config))
    text = "year 2024, 1234567"
    ours = _load(tmp_path, trained, "deepseek-llm").encode(text)
    assert digit_runs.encode(text).ids != ours


def test_joyai_llm_is_deepseek_v3(trained: Tokenizer, tmp_path: Path) -> None:
    v3 = _load(tmp_path, trained, "deepseek-v3")
    joyai = _load(tmp_path, trained, "joyai-llm")
    assert [joyai.encode(t) for t in CORPUS] == [v3.encode(t) for t in CORPUS]


def test_unknown_pre_names_the_supported_ones(trained: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "odd.gguf"
    _write_gguf(path, trained, "deepseek-v9")
    with pytest.raises(TokenizerLoadError, match=r"'deepseek-v9' is not supported.*deepseek-v3"):
        load_tokenizer(path)
