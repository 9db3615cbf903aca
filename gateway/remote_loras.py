"""RemoteLoras: `engine.loras` of an engine in the child process (gateway/remote_engine.py).

    load(name, path)   ──► LoadLora(call_id)     the child runs engine.loras.load in a task of
    unload(name)       ──► UnloadLora(call_id)   its own (other commands go on meanwhile)
                       ◄── LoraReply(call_id)    its end, and the adapters after it

The child's registry (actors/lora_registry.py) owns the adapters; `adapters` here is what its
latest reply (or Hello) said. The child sends each reply right after the change it reports, in
the order the changes happened, so the latest reply is the child's current set. A failed call
raises what the in-process registry raises: LoraAdapterError (field, code) or ConfigError.
"""

from __future__ import annotations

from collections.abc import Callable

from troupe.actors.lora_registry import LoraAdapterError
from troupe.config import ConfigError
from troupe.gateway.pending_calls import PendingCalls
from troupe.messages.engine_protocol import (
    LoadLora,
    LoraAdapter,
    LoraCallError,
    LoraReply,
    ToEngine,
    UnloadLora,
)


class RemoteLoras:
    """The gateway's LoraAdmin (gateway/engine_api.py) over the engine protocol."""

    def __init__(self, send: Callable[[ToEngine], None]) -> None:
        self.adapters: dict[str, str] = {}  # name -> folder, as the child last said
        self._calls: PendingCalls[LoraReply] = PendingCalls(send)

    async def load(self, name: str, path: str) -> None:
        await self._call(lambda call_id: LoadLora(call_id=call_id, name=name, path=path))

    async def unload(self, name: str) -> None:
        await self._call(lambda call_id: UnloadLora(call_id=call_id, name=name))

    def show(self, adapters: tuple[LoraAdapter, ...]) -> None:
        """The child's adapters now (Hello, then each LoraReply)."""
        self.adapters = {a.name: a.path for a in adapters}

    def on_reply(self, reply: LoraReply) -> None:
        self.show(reply.adapters)
        self._calls.answer(reply.call_id, reply)

    def stop(self, why: str) -> None:
        """The engine is gone: the calls still waiting raise EngineStopped, as do later ones."""
        self._calls.stop(why)

    async def _call(self, make: Callable[[int], LoadLora | UnloadLora]) -> None:
        reply = await self._calls.call(make)
        if reply.error is not None:
            raise call_error(reply.error)


def call_error(error: LoraCallError) -> Exception:
    """The exception the in-process registry would have raised."""
    if error.error_type == "LoraAdapterError":
        assert error.field is not None and error.code is not None, error
        return LoraAdapterError(error.field, error.message, error.code)
    if error.error_type == "ConfigError":
        return ConfigError(error.message)
    return RuntimeError(f"the engine failed the LoRA call: {error.message}")
