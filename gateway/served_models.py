"""What a request's `model` may name: the base model under its served names, or one of its
LoRA adapters (vLLM's `--served-model-name` and `--lora-modules`).

    model absent, "" or a served name         ->  the base model       (SamplingParams.lora None)
    model an adapter's name                   ->  that adapter         (SamplingParams.lora = it)
    anything else                             ->  404 model_not_found, listing what is served

The served names are `GatewaySettings.served_model_name`, or, without it, the engine's own id
for the model (`EngineLike.model_name`). The first served name is the model's public id: the
`model` of the base model's answers, the `parent` of every adapter, `/health`'s and /metrics'
`model_name` (vLLM's rule). A served name wins over an adapter of the same name (as vLLM's base
model does): such an adapter is neither reachable nor listed. GET /v1/models lists each served
name (`root`: the engine's id for the model), then each adapter in vLLM's shape: `root` its
folder, `parent` the model's public id. The adapters are the engine's (`EngineLike.lora_adapters`:
the in-process Engine's registry, or what the engine child's Hello and LoRA replies said; they
change at run time, gateway/lora_routes.py): the engine that runs them is their one owner, and
the gateway keeps no copy of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from troupe.gateway.engine_api import EngineLike
from troupe.gateway.errors import ApiError


@dataclasses.dataclass(frozen=True)
class ServedModels:
    """The engine's id for the model, the adapters' folders by name, and the served names."""

    base: str  # the engine's id for the model (`EngineLike.model_name`): the cards' root
    adapters: Mapping[str, str] = dataclasses.field(default_factory=dict)
    names: tuple[str, ...] = ()  # --served-model-name (); (): `base` alone

    @classmethod
    def of(cls, engine: EngineLike, names: Sequence[str] = ()) -> ServedModels:
        return cls(engine.model_name, engine.lora_adapters, tuple(names))

    @property
    def served_names(self) -> tuple[str, ...]:
        """The names a request's `model` may give the base model, the public id first."""
        return self.names or (self.base,)

    @property
    def model_id(self) -> str:
        """The model's public id: its answers' `model`, its adapters' `parent`."""
        return self.served_names[0]

    def lora_for(self, model: str | None) -> str | None:
        """The adapter `model` selects (None: the base model); ApiError 404 when it names
        neither the base model nor an adapter."""
        if not model or model in self.served_names:
            return None
        if model in self.adapters:
            return model
        served = ", ".join(f"'{name}'" for name in (*self.served_names, *self._visible()))
        what = "the model and its LoRA adapters" if self._visible() else "the model"
        message = f"model '{model}' does not exist; this server serves {what}: {served}"
        raise ApiError(404, message, param="model", code="model_not_found")

    def name_of(self, lora: str | None) -> str:
        """The id an answer's `model` carries: the adapter's name, or the public id."""
        return self.model_id if lora is None else lora

    def cards(self, max_model_len: int) -> list[dict[str, Any]]:
        """GET /v1/models' `data`: the served names first (the page reads its limits from the
        first), then the adapters."""
        bases = [
            self._card(name, root=self.base, parent=None, max_model_len=max_model_len)
            for name in self.served_names
        ]
        return bases + [
            self._card(name, root=path, parent=self.model_id, max_model_len=max_model_len)
            for name, path in self._visible().items()
        ]

    def _visible(self) -> dict[str, str]:
        """The adapters a request can reach: those no served name shadows."""
        return {n: p for n, p in self.adapters.items() if n not in self.served_names}

    @staticmethod
    def _card(name: str, *, root: str, parent: str | None, max_model_len: int) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "troupe",
            "root": root,
            "parent": parent,
            "max_model_len": max_model_len,  # an adapter runs within the base model's context
        }
