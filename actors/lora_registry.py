"""The LoRA adapters a request may name, while the engine runs: the one owner of their names.

A request names an adapter by its public name (SamplingParams.lora; over HTTP its `model`).
The registry checks the name at the engine's edge (a Rejected naming `lora`), counts the
requests in flight on each adapter, and loads and unloads adapters at run time
(`engine.loras.load` / `.unload`; over HTTP vLLM's /v1/load_lora_adapter and
/v1/unload_lora_adapter, gateway/lora_routes.py):

    load("sql", path)     the runner reads and checks it (a worker thread), then requests may
                          name "sql"
    unload("sql")         refused while requests run on it; then new requests are refused
                          and the runner frees it
    load("sql", path2)    a new adapter under the old name: inside the engine it runs as
                          "sql#2", so the prefix cache never serves KV the old weights made
                          (its namespace is the adapter's: SamplingParams.cache_namespace)

Adapters of lora_modules keep their names inside; the runner (ModelRunner.lora) holds the
weights; a runner without adapters (the fake one) takes the names alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import msgspec
from troupe.config import EngineConfig
from troupe.config_checks import LORA_NAME, LORA_NAME_RULE
from troupe.messages import GenerateRequest, LoraErrorCode

if TYPE_CHECKING:
    from troupe.gpu.lora_runtime import AdapterStore


def public_name(inside: str) -> str:
    """The public name of an adapter from its name inside the engine ("sql#2" -> "sql")."""
    return inside.partition("#")[0]


class LoraAdapterError(ValueError):
    """A load or unload that cannot be done; `field` names the offending input, `code` says
    why (the gateway answers 404 for NOT_FOUND, 409 for IN_USE, 400 for the rest)."""

    def __init__(self, field: str, message: str, code: LoraErrorCode) -> None:
        super().__init__(message)
        self.field = field
        self.code = code


class LoraRegistry:
    """Public name -> (the name inside the engine, its folder); requests in flight per name."""

    def __init__(self, config: EngineConfig) -> None:
        self.is_enabled = config.enable_lora or bool(config.lora_modules)
        self._adapters = {name: (name, path) for name, path in config.lora_adapters.items()}
        self._generation: dict[str, int] = {}  # loads of each public name so far
        self._in_flight: dict[str, int] = {}  # public name -> requests not yet ended
        self._request_adapter: dict[str, str] = {}  # request id -> public name
        self._busy: set[str] = set()  # names being loaded or unloaded now
        # the runner's (a LoraRuntime, or tensor-parallel workers' client), once started
        self.runtime: AdapterStore | None = None

    @property
    def adapters(self) -> dict[str, str]:
        """Folder by public name, of the adapters a request may name now."""
        return {name: path for name, (_, path) in self._adapters.items()}

    def admit(self, request: GenerateRequest) -> GenerateRequest | str:
        """The request as the engine runs it (the adapter's inside name: itself unless
        reloaded), counted in flight; or why it is refused (naming `lora`)."""
        params, name = request.params, request.params.lora
        if name is None:
            return request
        entry = self._adapters.get(name)
        if entry is None or name in self._busy:
            known = ", ".join(sorted(self._adapters)) or "none"
            return f"lora: no adapter named {name!r}; this engine serves {known}"
        self._in_flight[name] = self._in_flight.get(name, 0) + 1
        self._request_adapter[request.request_id] = name
        inside = entry[0]
        if inside == name:
            return request
        return msgspec.structs.replace(request, params=msgspec.structs.replace(params, lora=inside))

    def ended(self, request_id: str) -> None:
        """The request's terminal event is out (or it never reached the graph)."""
        if not self._request_adapter:
            return
        name = self._request_adapter.pop(request_id, None)
        if name is not None:
            self._in_flight[name] -= 1

    async def load(self, name: str, path: str) -> None:
        """Let requests name `name`, run by the adapter in folder `path` (vLLM's
        load_lora_adapter); LoraAdapterError, or the runner's ConfigError, when it cannot."""
        if not self.is_enabled:
            raise LoraAdapterError(
                "lora_name",
                "LoRA is off: start the engine with enable_lora (or lora_modules)",
                LoraErrorCode.LORA_DISABLED,
            )
        if not isinstance(name, str) or not LORA_NAME.fullmatch(name):
            raise LoraAdapterError(
                "lora_name",
                f"lora_name {name!r} must be {LORA_NAME_RULE}",
                LoraErrorCode.INVALID_VALUE,
            )
        if not isinstance(path, str) or not path:
            raise LoraAdapterError(
                "lora_path", "lora_path must be a folder's path", LoraErrorCode.INVALID_VALUE
            )
        if name in self._adapters or name in self._busy:
            message = f"a LoRA adapter named {name!r} is already loaded"
            raise LoraAdapterError("lora_name", message, LoraErrorCode.EXISTS)
        generation = self._generation.get(name, 0) + 1
        inside = name if generation == 1 else f"{name}#{generation}"
        self._busy.add(name)
        try:
            if self.runtime is not None:
                await anyio.to_thread.run_sync(self.runtime.add, inside, path)
        finally:
            self._busy.discard(name)
        self._generation[name] = generation
        self._adapters[name] = (inside, path)

    async def unload(self, name: str) -> None:
        """Stop serving `name` and free its weights; refused while requests run on it."""
        entry = self._adapters.get(name)
        if entry is None or name in self._busy:
            message = f"no LoRA adapter named {name!r} is loaded"
            raise LoraAdapterError("lora_name", message, LoraErrorCode.NOT_FOUND)
        if in_flight := self._in_flight.get(name, 0):
            raise LoraAdapterError(
                "lora_name",
                f"LoRA adapter {name!r} has {in_flight} requests in flight; unload it once they "
                "end (or abort them)",
                LoraErrorCode.IN_USE,
            )
        del self._adapters[name]
        self._in_flight.pop(name, None)
        if name not in self._generation:  # one of lora_modules: its next load is the second
            self._generation[name] = 1
        if self.runtime is not None:  # tensor-parallel workers: a round trip between steps
            self._busy.add(name)
            try:
                await anyio.to_thread.run_sync(self.runtime.retire, entry[0])
            finally:
                self._busy.discard(name)
