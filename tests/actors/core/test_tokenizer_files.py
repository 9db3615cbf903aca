"""Loading tokenizers from GGUF and HF folders; parity with transformers on the real SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from troupe.actors.core.tokenizer_files import TokenizerLoadError, load_tokenizer
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.config import default_model_path
from troupe.gguf_file import read_gguf_metadata

TEXTS = [
    "Hello, world!",
    "Ünïcödé ΑΒΓ привет мир 東京 naïve café — “quotes”",
    "emoji 😀👍🏽🇫🇷 family 👨‍👩‍👧",
    "def f(x):\n    return x**2  # comment\n\tindented\r\n",
    "whitespace    runs\n\n\n   and\ttabs\t\t end   ",
    "I'm sure you'll see they've done it, don't you?",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "numbers 1234567 3.14159 1e-9 0x1F",
    "x = [1, 2, 3]\nprint(x[0])",
    "",
    " ",
    "a",
]


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


@pytest.fixture(scope="module")
def hf_tok() -> Any:
    transformers = pytest.importorskip("transformers")
    path = default_model_path()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_gguf_load_reads_metadata() -> None:
    tok = load_tokenizer(default_model_path())
    assert tok.vocab_size == 49152
    assert tok.bos_token_id == 1 and tok.bos_token == "<|im_start|>"
    assert tok.eos_token_ids == (2,) and tok.eos_token == "<|im_end|>"
    assert tok.special_ids == frozenset(range(17))
    assert tok.chat_template is not None and "<|im_start|>" in tok.chat_template
    meta = read_gguf_metadata(default_model_path())
    assert meta["tokenizer.ggml.pre"] == "smollm"
    assert meta["llama.block_count"] == 30
    merges = meta["tokenizer.ggml.merges"]
    assert isinstance(merges, list) and len(merges) == 48900


def test_encode_matches_transformers(tok: TextTokenizer, hf_tok: Any) -> None:
    for text in TEXTS:
        assert tok.encode(text) == hf_tok(text)["input_ids"], text
        assert (
            tok.encode(text, add_special_tokens=False)
            == hf_tok(text, add_special_tokens=False)["input_ids"]
        ), text
    assert tok.encode_batch(TEXTS) == [tok.encode(t) for t in TEXTS]
    assert tok.encode("Hello world") == [19556, 905]  # no BOS: SmolLM2 adds none by default


def test_decode_matches_transformers(tok: TextTokenizer, hf_tok: Any) -> None:
    for text in TEXTS:
        ids = tok.encode(text)
        for skip in (True, False):
            assert tok.decode(ids, skip) == hf_tok.decode(ids, skip_special_tokens=skip), text
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_digit_split_follows_original_smollm2(tok: TextTokenizer) -> None:
    # transformers' GGUF loader drops the digit pre-split; llama.cpp's "smollm" and the original
    # tokenizer.json keep it, so a space run before a digit stays one token (256 = "ĠĠ").
    assert tok.encode("a  12") == [81, 256, 33, 34]
    assert tok.encode("12345") == [33, 34, 35, 36, 37]


def test_token_bytes_rebuild_text(tok: TextTokenizer) -> None:
    for text in TEXTS:
        assert b"".join(tok.token_bytes(i) for i in tok.encode(text)) == text.encode(), text
    assert tok.token_bytes(40303) == b" \xf0\x9f\x98"  # first 3 bytes of " 😀"
    assert tok.token_bytes(2) == b"<|im_end|>"
    assert tok.token_bytes(10**6) == b""


def test_chat_template_matches_transformers(tok: TextTokenizer, hf_tok: Any) -> None:
    conversations = [
        [{"role": "user", "content": "Hi there"}],
        [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": 'émoji 😀 and <b>html</b> & "quotes"'},
        ],
    ]
    for messages in conversations:
        for add in (True, False):
            expected = hf_tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add
            )
            assert tok.render_chat(messages, add_generation_prompt=add) == expected


def _save_hf_folder(tok: TextTokenizer, folder: Path, **config: Any) -> None:
    tok.tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def test_hf_folder_loads(tok: TextTokenizer, tmp_path: Path) -> None:
    _save_hf_folder(
        tok,
        tmp_path,
        bos_token={"content": "<|im_start|>", "special": True},
        eos_token="<|im_end|>",
        chat_template=tok.chat_template,
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    loaded = load_tokenizer(tmp_path)
    assert loaded.bos_token_id == 1
    assert loaded.eos_token_ids == (2, 0)
    assert loaded.encode(TEXTS[3]) == tok.encode(TEXTS[3])
    messages = [{"role": "user", "content": "hey"}]
    assert loaded.render_chat(messages) == tok.render_chat(messages)
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0]['content'] }}")
    assert load_tokenizer(tmp_path).render_chat(messages) == "<|im_start|>hey"


def test_missing_and_broken_files_name_the_file(tok: TextTokenizer, tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match=r"tokenizer\.json: missing"):
        load_tokenizer(tmp_path)
    _save_hf_folder(tok, tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match=r"tokenizer_config\.json: not valid JSON"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<nope>"}))
    with pytest.raises(TokenizerLoadError, match=r"tokenizer_config\.json: special token '<nope>'"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("[]")
    with pytest.raises(TokenizerLoadError, match=r"tokenizer\.json: not a valid tokenizer"):
        load_tokenizer(tmp_path)
    bad_gguf = tmp_path / "model.gguf"
    bad_gguf.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(TokenizerLoadError, match=r"model\.gguf: not a GGUF file"):
        load_tokenizer(bad_gguf)
    with pytest.raises(TokenizerLoadError, match="no such model"):
        load_tokenizer(tmp_path / "absent")


def _write_gguf(path: Path, **fields: Any) -> None:
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in fields.items():
        if isinstance(value, str):
            writer.add_string(key.replace("__", "."), value)
        else:
            writer.add_array(key.replace("__", "."), value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def test_gguf_without_a_usable_tokenizer_names_the_key(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    _write_gguf(empty)
    with pytest.raises(
        TokenizerLoadError, match=r"empty\.gguf: GGUF metadata has no 'tokenizer\.ggml\.model'"
    ):
        load_tokenizer(empty)
    spm = tmp_path / "spm.gguf"
    _write_gguf(spm, tokenizer__ggml__model="llama")
    with pytest.raises(TokenizerLoadError, match=r"spm\.gguf: tokenizer\.ggml\.model is 'llama'"):
        load_tokenizer(spm)
    odd = tmp_path / "odd.gguf"
    _write_gguf(
        odd,
        tokenizer__ggml__model="gpt2",
        tokenizer__ggml__pre="mystery",
        tokenizer__ggml__tokens=["a", "b", "ab"],
        tokenizer__ggml__merges=["a b"],
    )
    with pytest.raises(
        TokenizerLoadError, match=r"tokenizer\.ggml\.pre 'mystery' is not supported"
    ):
        load_tokenizer(odd)


def test_tiny_gguf_tokenizer_round_trips(tmp_path: Path) -> None:
    tiny = tmp_path / "tiny.gguf"
    _write_gguf(
        tiny,
        tokenizer__ggml__model="gpt2",
        tokenizer__ggml__pre="gpt2",
        tokenizer__ggml__tokens=["<eos>", "a", "b", "Ġ", "ab", "Ġab"],
        tokenizer__ggml__merges=["a b", "Ġ ab"],
    )
    tok = load_tokenizer(tiny)
    assert tok.encode("ab ab") == [4, 5]
    assert tok.decode([4, 5]) == "ab ab"
    assert tok.bos_token_id is None and tok.eos_token_ids == () and tok.chat_template is None
