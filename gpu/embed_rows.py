"""Input embeddings in place of token embeddings (SeqWork.prompt_embeds: an embeddings
prompt's rows, EngineConfig.enable_prompt_embeds; SeqWork.images: the rows a vision encoder
makes of a prompt's images), from a step's flat rows to the model.

    plan.seqs:      A(decode)   B(chunk, rows 0..2 given)      C(chunk of a token prompt)
    flat rows:      0           1  2  3                         4  5
    StepEmbeds:     rows = [1, 2, 3], pieces = (B's rows,)
    the model:      h = embed(ids); h[1:4] = B's rows  (after Gemma's scaling: the rows are what
                    the first decoder layer reads, as HF's inputs_embeds are)

Eagerly the rows are an index_copy (EagerRows); a mixed-step CUDA graph reads them from static
buffers it captured, a mask and the values (GraphRows, gpu/mixed_graphs.py). The rows arrive in
their own dtype and are cast to the model's here. An image's rows are the vision encoder's
(gpu/vision_encoder.py), run on the step's images when its rows are made (`values`): each
distinct image once, the chunk's slice of its rows taken (an image a chunk boundary cuts is
encoded by both chunks' steps).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np
import torch
from troupe.messages import PromptEmbeds, PromptImage, SeqWork

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Images the vision encoder takes at once: its activation peak (gpu/activation_profile.py
# measures a batch this size) stays bounded however many images a step holds
ENCODE_BATCH = 8


class ImageEncoder(Protocol):
    """What makes an image's rows: gpu/vision_encoder.VisionEncoder."""

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor: ...


@dataclasses.dataclass(frozen=True)
class ImageSlice:
    """Rows first .. stop - 1 of an image's encoding, fed to one chunk's positions."""

    image: PromptImage
    first: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.first


@dataclasses.dataclass(frozen=True)
class StepEmbeds:
    """A step's flat rows fed input embeddings, and those embeddings in row order."""

    rows: np.ndarray  # int64 [R]
    pieces: tuple[PromptEmbeds | ImageSlice, ...]

    def shifted(self, offset: int) -> StepEmbeds:
        return StepEmbeds(self.rows + offset, self.pieces)

    def values(
        self, dtype: torch.dtype, device: torch.device, encoder: ImageEncoder | None = None
    ) -> torch.Tensor:
        """[R, hidden] on `device`, in `dtype` (images encoded by `encoder`)."""
        encoded = _encoded(self.pieces, encoder, device)
        parts = [
            encoded[p.image.digest][p.first : p.stop].to(dtype)
            if isinstance(p, ImageSlice)
            else torch.frombuffer(bytearray(p.data), dtype=TORCH_DTYPES[p.dtype])
            .view(p.num_rows, p.hidden_size)
            .to(device=device, dtype=dtype)
            for p in self.pieces
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _encoded(
    pieces: tuple[PromptEmbeds | ImageSlice, ...],
    encoder: ImageEncoder | None,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """Each distinct image of `pieces` encoded, by digest; images of one size in one batch."""
    images = {p.image.digest: p.image for p in pieces if isinstance(p, ImageSlice)}
    if not images:
        return {}
    assert encoder is not None, "a step with images needs the model's vision encoder"
    by_size: dict[tuple[int, int], list[PromptImage]] = {}
    for image in images.values():
        by_size.setdefault((image.height, image.width), []).append(image)
    out: dict[str, torch.Tensor] = {}
    for (height, width), same in by_size.items():
        for at in range(0, len(same), ENCODE_BATCH):
            group = same[at : at + ENCODE_BATCH]
            pixels = torch.stack(
                [
                    torch.frombuffer(bytearray(i.pixels), dtype=torch.float32).view(
                        3, height, width
                    )
                    for i in group
                ]
            ).to(device)
            for image, rows in zip(group, encoder(pixels), strict=True):
                out[image.digest] = rows
    return out


def step_embeds(seqs: tuple[SeqWork, ...], query_start_loc: np.ndarray) -> StepEmbeds | None:
    """The rows of `seqs` (flat, as query_start_loc places them) that take input embeddings:
    each SeqWork's first prompt_embeds.num_rows rows, and the rows of its images'
    placeholders in its chunk. None when no SeqWork has any."""
    given = [(i, w) for i, w in enumerate(seqs) if w.prompt_embeds is not None or w.images]
    if not given:  # every step asks: one pass at C speed over its sequences
        return None
    rows: list[np.ndarray] = []
    pieces: list[PromptEmbeds | ImageSlice] = []
    for i, w in given:
        at = int(query_start_loc[i])
        if w.prompt_embeds is not None:
            rows.append(np.arange(w.prompt_embeds.num_rows, dtype=np.int64) + at)
            pieces.append(w.prompt_embeds)
        for image in w.images:  # the chunk holds positions start_pos .. start_pos + n - 1
            first = max(0, w.start_pos - image.start)
            stop = min(image.num_rows, w.start_pos + w.num_tokens - image.start)
            if first < stop:
                offset = at + image.start + first - w.start_pos
                rows.append(np.arange(offset, offset + stop - first, dtype=np.int64))
                pieces.append(ImageSlice(image, first, stop))
    if not pieces:
        return None
    return StepEmbeds(np.concatenate(rows), tuple(pieces))


def key_limits(embeds: StepEmbeds | None, positions: np.ndarray) -> np.ndarray | None:
    """Each row's last visible key position where a step's image rows attend to their whole
    image (Gemma 3's language model: every row of an image sees every other), else its own
    position (causal); None when the step feeds no image rows. The scheduler keeps an image
    in one chunk, so every key a row may see is in the cache when it attends."""
    if embeds is None or not any(isinstance(p, ImageSlice) for p in embeds.pieces):
        return None
    limits = positions.astype(np.int32)
    at = 0
    for piece in embeds.pieces:
        if isinstance(piece, ImageSlice):
            limits[embeds.rows[at : at + piece.num_rows]] = piece.image.stop - 1
        at += piece.num_rows
    return limits


def join_embeds(
    first: StepEmbeds | None, second: StepEmbeds | None, offset: int
) -> StepEmbeds | None:
    """Both steps' rows as one step's, `second`'s after `offset` rows of `first`'s step
    (step_inputs.concat_inputs)."""
    if second is not None:
        second = second.shifted(offset)
    if first is None or second is None:
        return first or second
    return StepEmbeds(np.concatenate([first.rows, second.rows]), first.pieces + second.pieces)


class EagerRows:
    """The step's embeddings on the device: the model's embedding rows with these replaced."""

    def __init__(
        self,
        embeds: StepEmbeds,
        dtype: torch.dtype,
        device: torch.device,
        encoder: ImageEncoder | None = None,
    ) -> None:
        self.index = torch.from_numpy(embeds.rows).to(device)
        self.values = embeds.values(dtype, device, encoder)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.index_copy(0, self.index, self.values)


class GraphRows:
    """A captured graph's view of its static buffers: rows where `mask` is set take `values`."""

    def __init__(self, mask: torch.Tensor, values: torch.Tensor) -> None:
        self.mask = mask  # bool [T, 1]
        self.values = values  # [T, hidden], the model's dtype

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.where(self.mask, self.values, hidden)


class EmbedsBuffers:
    """The static buffers a mixed-step graph reads its input embeddings from, and how a step's
    rows get there (before the replay, on the graph's stream)."""

    def __init__(
        self, max_tokens: int, hidden_size: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.mask = torch.zeros(max_tokens, 1, dtype=torch.bool, device=device)
        self.values = torch.zeros(max_tokens, hidden_size, dtype=dtype, device=device)
        self._is_set = False  # some mask row is set (cleared before a step without rows)

    def rows(self, size: int) -> GraphRows:
        """The view a graph of `size` tokens captures."""
        return GraphRows(self.mask[:size], self.values[:size])

    def fill(self, embeds: StepEmbeds | None, encoder: ImageEncoder | None = None) -> None:
        """Set the step's rows (none: clear what an earlier step set)."""
        if self._is_set:
            self.mask.zero_()
            self._is_set = False
        if embeds is None:
            return
        device = self.values.device
        index = torch.from_numpy(embeds.rows).to(device)
        self.values.index_copy_(0, index, embeds.values(self.values.dtype, device, encoder))
        self.mask.index_fill_(0, index, True)
        self._is_set = True


def prompt_embeds_of(tensor: torch.Tensor) -> PromptEmbeds:
    """An embeddings prompt from a [seq_len, hidden_size] tensor (vLLM's EmbedsPrompt), for
    Engine.generate: float32, float16 and bfloat16 rows travel as they are, other float
    dtypes as float32; the runner casts them to the model's dtype. The engine checks the
    shape against the model (hidden size, max_model_len) and refuses what does not fit by
    name."""
    if tensor.dim() != 2:
        raise ValueError(
            f"prompt_embeds must be a [seq_len, hidden_size] tensor, got {tuple(tensor.shape)}"
        )
    if not tensor.is_floating_point():
        raise ValueError(f"prompt_embeds must hold floats, got {tensor.dtype}")
    names = {v: k for k, v in TORCH_DTYPES.items()}
    if tensor.dtype not in names:
        tensor = tensor.float()
    rows = tensor.detach().to("cpu").contiguous()
    data = rows.view(torch.uint8).numpy().tobytes() if rows.numel() else b""
    return PromptEmbeds(data, rows.shape[0], rows.shape[1], names[rows.dtype])
