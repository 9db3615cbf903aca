"""EngineConfig's checks of pipeline parallelism (pipeline_parallel_size > 1): the size, the
explicit layer partition's form, and the features it does not combine with (ConfigError naming
the field). What the model must split into (layers per stage) is checked against the model in
gpu/pp_stage.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from troupe.config_checks import ConfigError, check_needs

if TYPE_CHECKING:
    from troupe.config import EngineConfig

# What pipeline parallelism does not combine with yet: (field, the value it needs). Each needs
# the model or its hidden states in one process (a proposer, adapters loaded at run time, sleep
# mode, prompt embeddings fed by id), or is another split of the model (tensor parallelism).
_PIPELINE_NEEDS: tuple[tuple[str, object], ...] = (
    ("runner", "model"), ("tensor_parallel_size", 1), ("disaggregation", "none"),
    ("speculative_method", None), ("lora_modules", ()), ("enable_lora", False),
    ("enable_sleep_mode", False), ("enable_prompt_embeds", False),
)  # fmt: skip


def check_pipeline(config: EngineConfig) -> None:
    """ConfigError naming the first pipeline field or feature that cannot be served."""
    size = config.pipeline_parallel_size
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ConfigError(f"pipeline_parallel_size must be an integer >= 1, got {size!r}")
    partition = config.pipeline_layer_partition
    if partition is not None:
        if size == 1:
            raise ConfigError(
                f"pipeline_layer_partition {partition!r} needs pipeline_parallel_size > 1"
            )
        parts = partition.split(",") if isinstance(partition, str) else []
        if len(parts) != size or not all(p.strip().isdigit() for p in parts):
            raise ConfigError(
                f"pipeline_layer_partition must be {size} comma-separated layer counts (one "
                f"per stage of pipeline_parallel_size {size}), got {partition!r}"
            )
    if size == 1:
        return
    check_needs(
        config, _PIPELINE_NEEDS, f"pipeline_parallel_size {size}", "not supported together yet"
    )
