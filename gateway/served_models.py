"""What a request's `model` may name: the base model, or one of its LoRA adapters (vLLM's
`--lora-modules`).

    model absent, "" or the base model's id  ->  the base model       (SamplingParams.lora None)
    model an adapter's name                  ->  that adapter         (SamplingParams.lora = it)
    anything else                            ->  404 model_not_found, listing what is served

The base model's id wins over an adapter of the same name (as in vLLM). GET /v1/models lists
the base model, then each adapter in vLLM's shape: `root` its folder, `parent` the base
model's id. The adapters are the engine's (`EngineLike.lora_adapters`: the in-process Engine's
registry, or what the engine child's Hello and LoRA replies said; they change at run time,
gateway/lora_routes.py): the engine that runs them is their one owner, and the gateway keeps
no copy of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from troupe.gateway.engine_api import EngineLike
from troupe.gateway.errors import ApiError


@dataclasses.dataclass(frozen=True)
class ServedModels:
    """The base model's id and the adapters' folders by name."""

    base: str
    adapters: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, engine: EngineLike) -> ServedModels:
        return cls(engine.model_name, engine.lora_adapters)

    def lora_for(self, model: str | None) -> str | None:
        """The adapter `model` selects (None: the base model); ApiError 404 when it names
        neither the base model nor an adapter."""
        if not model or model == self.base:
            return None
        if model in self.adapters:
            return model
        served = ", ".join(f"'{name}'" for name in (self.base, *self.adapters))
        what = "the model and its LoRA adapters" if self.adapters else "the model"
        message = f"model '{model}' does not exist; this server serves {what}: {served}"
        raise ApiError(404, message, param="model", code="model_not_found")

    def name_of(self, lora: str | None) -> str:
        """The id an answer's `model` carries: the adapter's name, or the base model's."""
        return self.base if lora is None else lora

    def cards(self, max_model_len: int) -> list[dict[str, Any]]:
        """GET /v1/models' `data`: the base model first (the page reads its limits there)."""
        base = self._card(self.base, root=self.base, parent=None, max_model_len=max_model_len)
        return [base] + [
            self._card(name, root=path, parent=self.base, max_model_len=max_model_len)
            for name, path in self.adapters.items()
            if name != self.base  # shadowed by the base model: no request reaches it here
        ]

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
