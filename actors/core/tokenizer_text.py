"""TextTokenizer: one model's tokenizer, special tokens and chat template behind one face.

Wraps an HF `tokenizers.Tokenizer` (built from tokenizer.json or from GGUF metadata). Besides
encode/decode it knows the raw bytes of every token, which the incremental detokenizer needs:
a byte-level BPE token may hold half of a UTF-8 character, which its decoded string cannot show.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer
from troupe.actors.core.chat_template import ChatTemplate, ChatTemplateError

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.cache
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte <-> printable-char table, inverted: char -> byte.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are shifted to 256+.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    table = {chr(b): b for b in printable}
    shift = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shift)] = b
            shift += 1
    return table


class TextTokenizer:
    """Encode/decode, token bytes, special ids and chat template of one model."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        source: str,
        bos_token_id: int | None,
        eos_token_ids: tuple[int, ...],
        chat_template: str | None,
        unk_token: str | None = None,
        pad_token: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.source = source  # the file or folder it came from, for error messages
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self.chat_template = chat_template
        # the template's variables when a request leaves them out (EngineConfig.
        # default_chat_template_kwargs, vLLM's --default-chat-template-kwargs)
        self.template_defaults: dict[str, Any] = {}
        added = tokenizer.get_added_tokens_decoder()
        self._added_text = {token_id: token.content for token_id, token in added.items()}
        self.special_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        self._special_tokens = {
            "bos_token": self._token_text(bos_token_id),
            "eos_token": self._token_text(eos_token_ids[0] if eos_token_ids else None),
            "unk_token": unk_token,
            "pad_token": pad_token,
        }

    @property
    def eos_token_id(self) -> int | None:
        """The primary end-of-sequence id (the chat template's `eos_token`)."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def bos_token(self) -> str | None:
        return self._special_tokens["bos_token"]

    @property
    def eos_token(self) -> str | None:
        return self._special_tokens["eos_token"]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; add_special_tokens adds BOS/EOS where the model does by default."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_pair(self, first: str, second: str) -> list[int]:
        """Token ids of two texts encoded as a pair (a cross-encoder's input): the
        post-processor's pair template, as transformers' `tokenizer(first, second)`."""
        return list(self.tokenizer.encode(first, second, add_special_tokens=True).ids)

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[list[int]]:
        """encode() of many texts at once (the Rust side runs them in parallel)."""
        if not texts:
            return []
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [list(e.ids) for e in encodings]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def token_strs(self, token_ids: Sequence[int]) -> list[str]:
        """Each id's entry in the vocabulary, as HF's convert_ids_to_tokens names it ("Ġworld"
        for " world" in a byte-level BPE; "" for ids outside it)."""
        return [self.tokenizer.id_to_token(i) or "" for i in token_ids]

    def all_token_bytes(self) -> tuple[bytes, ...]:
        """token_bytes of every id, in id order."""
        return self._bytes_table

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes token `token_id` stands for (b"" for ids outside the vocabulary)."""
        if 0 <= token_id < len(self._bytes_table):
            return self._bytes_table[token_id]
        return b""

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **extra: Any,
    ) -> str:
        """The prompt text for chat `messages` (ChatTemplate.render's options; `extra` over
        the template_defaults). Raises ChatTemplateError (no template, or the template
        rejected the conversation)."""
        text: str = self._compiled_template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **{**self.template_defaults, **extra},
        )
        return text

    @functools.cached_property
    def _compiled_template(self) -> ChatTemplate:
        if self.chat_template is None:
            raise ChatTemplateError(
                f"the model's tokenizer ({self.source}) has no chat template: "
                "send a plain prompt instead of chat messages"
            )
        return ChatTemplate(self.chat_template, special_tokens=self._special_tokens)

    @functools.cached_property
    def _bytes_table(self) -> tuple[bytes, ...]:
        # Built on first use: ~50 ms for a 50k vocabulary, only the streamer needs it.
        state = self.tokenizer.decoder.__getstate__() if self.tokenizer.decoder else b"{}"
        decoder = json.dumps(json.loads(state))
        is_byte_level = '"ByteLevel"' in decoder
        is_byte_fallback = '"ByteFallback"' in decoder
        alphabet = byte_level_alphabet()
        # byte level: each alphabet char -> the Latin-1 char of its byte, then one encode; the
        # other chars below 256 -> U+0100, so a token holding one takes the slow branch
        to_latin1 = {o: 0x100 for o in range(256)} | {ord(c): b for c, b in alphabet.items()}
        table: list[bytes] = []
        for token_id in range(self.vocab_size):
            token = self.tokenizer.id_to_token(token_id)
            if token is None:
                table.append(b"")
            elif token_id in self._added_text:
                table.append(self._added_text[token_id].encode())
            elif is_byte_level:
                latin1 = token.translate(to_latin1)
                if latin1.isascii() or max(latin1) <= "\xff":
                    table.append(latin1.encode("latin-1"))
                else:  # a char outside the alphabet: its UTF-8 bytes, as before
                    table.append(
                        b"".join(
                            bytes([alphabet[c]]) if c in alphabet else c.encode() for c in token
                        )
                    )
            elif is_byte_fallback and (match := _BYTE_TOKEN.fullmatch(token)):
                table.append(bytes([int(match.group(1), 16)]))
            elif is_byte_fallback or "Metaspace" in decoder:
                table.append(token.replace("▁", " ").encode())
            else:  # e.g. WordPiece: no byte view; the decoded text is the best we have
                table.append(self.tokenizer.decode([token_id], skip_special_tokens=False).encode())
        return tuple(table)

    def _token_text(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokenizer.id_to_token(token_id)
