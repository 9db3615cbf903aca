"""How the graph's cores are built: from plain constructor arguments, so that a trace header
can record them and replay can build the same cores without a model or a GPU."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from troupe.actors.core.admission import AdmissionCore
from troupe.actors.core.base import ActorName, Core

# Receiving actors, downstream first: the order the engine starts them in.
CORE_ACTORS: tuple[ActorName, ...] = (
    "streamer",
    "scheduler",
    "allocator",
    "admission",
    "tokenizer",
)


@functools.lru_cache(maxsize=4)
def load_tokenizer_for(model: str | None) -> Any:
    """The tokenizer of `model` (None: the default model), loaded once per process."""
    from troupe.actors.core.tokenizer_files import load_tokenizer
    from troupe.config import resolve_model_path

    return load_tokenizer(resolve_model_path(model))


def build_core(name: str, args: Mapping[str, Any]) -> Core[Any]:
    """A fresh core for actor `name` from its recorded constructor arguments."""
    if name == "tokenizer":
        from troupe.actors.core.tokenizer import TokenizerCore

        # Traces recorded before the tokenizer knew max_model_len replay without it.
        return TokenizerCore(
            load_tokenizer_for(args["model"]), max_model_len=args.get("max_model_len")
        )
    if name == "streamer":
        from troupe.actors.core.streamer import StreamerCore

        return StreamerCore(load_tokenizer_for(args["model"]))
    if name == "admission":
        return AdmissionCore(**args)
    if name == "scheduler":
        from troupe.actors.core.scheduler import SchedulerCore

        return SchedulerCore(**args)
    if name == "allocator":
        from troupe.actors.core.allocator import AllocatorCore

        return AllocatorCore(**args)
    raise ValueError(f"unknown actor {name!r}; expected one of {', '.join(CORE_ACTORS)}")


def core_args(
    *,
    model: str | None,
    block_size: int,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    vocab_size: int,
    max_model_len: int,
    eos_token_ids: tuple[int, ...],
    max_num_seqs: int,
    max_num_batched_tokens: int,
    enable_prefix_caching: bool,
    preemption_mode: str,
    scheduling_policy: str,
    max_queued_requests: int,
    max_queued_tokens: int,
    num_lookahead_tokens: int = 0,
) -> dict[str, dict[str, Any]]:
    """Constructor arguments of every core, from the config and the runner's numbers."""
    return {
        "tokenizer": {"model": model, "max_model_len": max_model_len},
        "streamer": {"model": model},
        "admission": {
            "max_model_len": max_model_len,
            "vocab_size": vocab_size,
            "max_num_seqs": max_num_seqs,
            "max_queued_requests": max_queued_requests,
            "max_queued_tokens": max_queued_tokens,
        },
        "scheduler": {
            "block_size": block_size,
            "num_gpu_blocks": num_gpu_blocks,
            "num_cpu_blocks": num_cpu_blocks,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "enable_prefix_caching": enable_prefix_caching,
            "preemption_mode": preemption_mode,
            "scheduling_policy": scheduling_policy,
            "eos_token_ids": list(eos_token_ids),
            "num_lookahead_tokens": num_lookahead_tokens,
        },
        "allocator": {
            "block_size": block_size,
            "num_gpu_blocks": num_gpu_blocks,
            "num_cpu_blocks": num_cpu_blocks,
            "enable_prefix_caching": enable_prefix_caching,
        },
    }
