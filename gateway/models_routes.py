"""GET /v1/models and /v1/models/{model} (OpenAI's list and retrieve; `client.models.retrieve`):
the served names, then the LoRA adapters (gateway/served_models.py). A name served nowhere is
a 404 `model_not_found` naming `model`, as OpenAI answers."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from troupe.gateway.errors import ApiError
from troupe.gateway.state import GATEWAY


def add_models_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model)  # ids may hold slashes (org/name)


async def models(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    cards = gateway.served_models().cards(gateway.engine.max_model_len)
    return web.json_response({"object": "list", "data": cards})


async def model(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    cards = gateway.served_models().cards(gateway.engine.max_model_len)
    return web.json_response(card_named(cards, request.match_info["model"]))


def card_named(cards: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The card of model `name` among `cards`, or the 404 OpenAI answers."""
    for card in cards:
        if card["id"] == name:
            return card
    raise ApiError(404, f"The model '{name}' does not exist", param="model", code="model_not_found")
