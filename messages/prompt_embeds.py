"""A prompt given as input embeddings (vLLM's `prompt_embeds`): rows the model's first decoder
layer reads in place of its token embeddings, one row per prompt position.

msgspec carries no tensor, so the rows travel as raw bytes with their shape and dtype name:

    data   row 0 | row 1 | ... | row L-1        L x hidden_size values, little-endian, C order
    dtype  "float32" | "float16" | "bfloat16"    (the runner casts them to the model's dtype)

Such a request's token ids are PLACEHOLDER_TOKEN_ID, one per row (vLLM uses 0 too): they count
its length and nothing else reads them. Its prefix-cache entries live in a namespace of their
own, `digest` (a hash of the rows, set where the request is tokenized): requests with the same
rows share cached blocks, any other rows never do (actors/core/embeds_check.py).
"""

from __future__ import annotations

import msgspec

PLACEHOLDER_TOKEN_ID = 0
# bytes per value of each dtype a prompt's rows may come in
EMBEDS_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


class PromptEmbeds(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Rows [num_rows, hidden_size] of a prompt's input embeddings, as raw bytes.

    As a whole prompt (Engine.generate's input, GenerateRequest) or a chunk's share of one
    (SeqWork.prompt_embeds: the rows of the chunk's positions, cut by `rows`)."""

    data: bytes
    num_rows: int
    hidden_size: int
    dtype: str = "float32"  # a key of EMBEDS_ITEMSIZE
    # the prefix-cache namespace of the rows; filled by the tokenizer (a client's is replaced)
    digest: str = ""

    @property
    def row_bytes(self) -> int:
        return self.hidden_size * EMBEDS_ITEMSIZE[self.dtype]

    def problem(self) -> str | None:
        """Why these rows cannot be fed (dtype, shape, byte count), None when they can."""
        if self.dtype not in EMBEDS_ITEMSIZE:
            names = ", ".join(EMBEDS_ITEMSIZE)
            return f"prompt_embeds dtype must be one of {names}, got {self.dtype!r}"
        if self.num_rows < 1:
            return f"prompt_embeds must hold at least one row, got {self.num_rows}"
        if self.hidden_size < 1:
            return f"prompt_embeds rows must hold at least one value, got {self.hidden_size}"
        expected = self.num_rows * self.row_bytes
        if len(self.data) != expected:
            return (
                f"prompt_embeds data holds {len(self.data)} bytes; shape [{self.num_rows}, "
                f"{self.hidden_size}] of {self.dtype} needs {expected}"
            )
        return None

    def rows(self, start: int, stop: int) -> PromptEmbeds:
        """Rows start..stop-1 (a prefill chunk's share), without the digest."""
        assert 0 <= start < stop <= self.num_rows, f"rows {start}..{stop} of {self.num_rows}"
        width = self.row_bytes
        return PromptEmbeds(
            self.data[start * width : stop * width], stop - start, self.hidden_size, self.dtype
        )
