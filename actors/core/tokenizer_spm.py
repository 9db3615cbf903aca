"""Gemma's sentencepiece vocabulary, as a GGUF file stores it, rebuilt as a `tokenizers` BPE.

A GGUF file of the Gemma family says `tokenizer.ggml.model = "llama"` (sentencepiece) and lists
its pieces, types and scores but no merges. Gemma's original tokenizer is a BPE with byte
fallback over text whose spaces are spelled "▁", split before each space, no prefix space.
The merges follow from the vocabulary: each piece that is the join of two pieces is the merge
of that pair, and the pieces are stored in merge order (Gemma's scores do not follow it), so
a piece's merge ranks by its position; among the splits of one piece, longer left parts
first. Pieces of two or more spaces are stored with real spaces; sentencepiece looks them up
as "▁▁...", so they are respelled first. This is what transformers does when it loads such a
file (the reference the tests compare against).
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

SPACE = "\u2581"


def user_defined_kept(piece: str, tokenizer: Tokenizer) -> bool:
    """Whether a user-defined piece becomes an added token: only one the vocabulary spells
    (a piece of real spaces is matched through its "▁" spelling instead)."""
    return tokenizer.token_to_id(piece) is not None


def gemma_tokenizer(pieces: list[str]) -> Tokenizer:
    """A Tokenizer (model, normalizer, pre-tokenizer, decoder) for Gemma's `pieces`; the
    caller adds special tokens and the BOS template."""
    spelled = [SPACE * len(p) if p and not p.strip(" ") else p for p in pieces]
    vocab = {piece: index for index, piece in enumerate(spelled)}  # a respelled twin: the last
    merges: list[tuple[str, str]] = []
    for piece in sorted(vocab, key=vocab.__getitem__):
        splits = [
            (piece[:cut], piece[cut:])
            for cut in range(len(piece) - 1, 0, -1)  # longer left parts first
            if piece[:cut] in vocab and piece[cut:] in vocab
        ]
        merges.extend(splits)
    tokenizer = Tokenizer(
        models.BPE(vocab, merges, unk_token=_unk(spelled), fuse_unk=True, byte_fallback=True)
    )
    tokenizer.normalizer = normalizers.Replace(" ", SPACE)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return tokenizer


def _unk(pieces: list[str]) -> str | None:
    return "<unk>" if "<unk>" in pieces else None
