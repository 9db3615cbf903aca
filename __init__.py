"""troupe: an LLM inference engine built as a troupe of async actors.

from troupe import Engine, EngineConfig, SamplingParams

async with Engine.open(EngineConfig()) as engine:
    async for event in engine.generate("Hello", SamplingParams(max_tokens=16)):
        print(event.text, end="")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from troupe.actors.engine import Engine
    from troupe.actors.engine_stopped import EngineStopped
    from troupe.actors.llm import LLM
    from troupe.actors.llm_outputs import CompletionOutput, RequestOutput
    from troupe.actors.offline import Completion, generate_batch
    from troupe.config import ConfigError, EngineConfig
    from troupe.gpu.embed_rows import prompt_embeds_of
    from troupe.messages import Pooling, PromptEmbeds, SamplingParams

# The package's face, imported when first asked for: `import troupe.gateway...` (the server's
# process, which runs no model) must not pull in the engine, and with it torch.
_HOMES = {
    "Completion": "troupe.actors.offline",
    "CompletionOutput": "troupe.actors.llm_outputs",
    "ConfigError": "troupe.config",
    "Engine": "troupe.actors.engine",
    "EngineConfig": "troupe.config",
    "EngineStopped": "troupe.actors.engine_stopped",
    "LLM": "troupe.actors.llm",
    "Pooling": "troupe.messages",
    "PromptEmbeds": "troupe.messages",
    "RequestOutput": "troupe.actors.llm_outputs",
    "SamplingParams": "troupe.messages",
    "generate_batch": "troupe.actors.offline",
    "prompt_embeds_of": "troupe.gpu.embed_rows",
}

__all__ = [
    "LLM",
    "Completion",
    "CompletionOutput",
    "ConfigError",
    "Engine",
    "EngineConfig",
    "EngineStopped",
    "Pooling",
    "PromptEmbeds",
    "RequestOutput",
    "SamplingParams",
    "generate_batch",
    "prompt_embeds_of",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'troupe' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later lookups skip this function
    return value
