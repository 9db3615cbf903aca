"""Which layers each pipeline stage holds, and what a pipeline cannot split (ConfigError).

    layers   0 .. L-1, split into P contiguous runs, one per stage (vLLM's get_pp_indices):
             L // P each; the L % P left over go one each to the stages before the last,
             nearest the last first (the last stage also runs the norm, lm_head and sampling)
             e.g. L=7, P=4: [2, 2, 2, 1]; or an explicit pipeline_layer_partition "3,4"

    stage 0           embed_tokens, layers [0, b0)
    stage s           layers [a_s, b_s): hidden states and residual in from s-1, out to s+1
    stage P-1         layers [a, L), the final norm and lm_head (embed_tokens too when tied)

A stage's ModelConfig is the whole model's with only its layers (their sliding windows and
expert flags sliced), so its DecoderModel and KV pool hold exactly those.
"""

from __future__ import annotations

import dataclasses

from troupe.config import ConfigError
from troupe.gpu.model_config import ModelConfig


def stage_sizes(num_layers: int, size: int, partition: str | None = None) -> tuple[int, ...]:
    """Layers per stage: vLLM's even split, or the explicit comma-separated `partition`."""
    if num_layers < size:
        raise ConfigError(
            f"pipeline_parallel_size ({size}) exceeds the model's num_hidden_layers "
            f"({num_layers}): every stage needs a layer"
        )
    if partition is not None:
        return _parsed_partition(partition, num_layers, size)
    sizes = [num_layers // size] * size
    for i in range(2, num_layers % size + 2):  # the extra layers: before the last stage
        sizes[-i] += 1
    return tuple(sizes)


def _parsed_partition(partition: str, num_layers: int, size: int) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in partition.split(","))
    except ValueError:
        raise ConfigError(
            f"pipeline_layer_partition must be comma-separated layer counts such as '3,5', "
            f"got {partition!r}"
        ) from None
    if len(sizes) != size:
        raise ConfigError(
            f"pipeline_layer_partition {partition!r} has {len(sizes)} entries for "
            f"pipeline_parallel_size {size}"
        )
    if min(sizes) < 1:
        raise ConfigError(f"pipeline_layer_partition {partition!r}: every stage needs a layer")
    if sum(sizes) != num_layers:
        raise ConfigError(
            f"pipeline_layer_partition {partition!r} sums to {sum(sizes)}, the model has "
            f"num_hidden_layers {num_layers}"
        )
    return sizes


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPStage:
    """Stage `index` of `size`: layers [first_layer, end_layer) of the whole model."""

    index: int
    size: int
    first_layer: int
    end_layer: int
    tie_word_embeddings: bool

    @classmethod
    def of(cls, full: ModelConfig, index: int, size: int, partition: str | None) -> PPStage:
        sizes = stage_sizes(full.num_layers, size, partition)
        first = sum(sizes[:index])
        return cls(
            index=index,
            size=size,
            first_layer=first,
            end_layer=first + sizes[index],
            tie_word_embeddings=full.tie_word_embeddings,
        )

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.size - 1

    @property
    def holds_embedding(self) -> bool:
        """Stage 0 embeds; the last stage reads the tied embedding as its lm_head."""
        return self.is_first or (self.is_last and self.tie_word_embeddings)

    def layer_config(self, full: ModelConfig) -> ModelConfig:
        """`full` with only this stage's layers: what its DecoderModel and KV pool hold."""
        lo, hi = self.first_layer, self.end_layer
        moe = full.moe
        if moe is not None:
            moe = dataclasses.replace(moe, sparse_layers=moe.sparse_layers[lo:hi])
        return dataclasses.replace(
            full,
            num_layers=hi - lo,
            layer_windows=full.layer_windows[lo:hi],
            nope_layers=full.nope_layers[lo:hi],
            moe=moe,
            num_mtp_layers=0,
        )

    def local_layer(self, name: str) -> str | None:
        """An HF tensor name renamed to this stage's layer numbering; None for another stage's
        layer; the name itself when it is not a layer's."""
        parts = name.split(".")
        if len(parts) < 4 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
            return name
        index = int(parts[2])
        if not self.first_layer <= index < self.end_layer:
            return None
        return ".".join(["model", "layers", str(index - self.first_layer), *parts[3:]])


def check_pipeline_parallel(full: ModelConfig, size: int, partition: str | None) -> None:
    """ConfigError when the model does not split into `size` stages, naming the count."""
    stage_sizes(full.num_layers, size, partition)
    if full.mla is not None:
        raise ConfigError(
            f"pipeline_parallel_size {size}: DeepSeek's latent attention (MLA) is not split "
            "into pipeline stages yet"
        )
    if full.classifier is not None:
        raise ConfigError(
            f"pipeline_parallel_size {size}: not supported with a classification model"
        )
