"""troupe: an LLM inference engine built as a troupe of async actors.

from troupe import Engine, EngineConfig, SamplingParams

async with Engine.open(EngineConfig()) as engine:
    async for event in engine.generate("Hello", SamplingParams(max_tokens=16)):
        print(event.text, end="")
"""

from troupe.actors.engine import Engine, EngineStopped
from troupe.actors.offline import Completion, generate_batch
from troupe.config import ConfigError, EngineConfig
from troupe.messages import SamplingParams

__all__ = [
    "Completion",
    "ConfigError",
    "Engine",
    "EngineConfig",
    "EngineStopped",
    "SamplingParams",
    "generate_batch",
]
