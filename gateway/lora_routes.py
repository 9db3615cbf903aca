"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter: LoRA adapters at run time, in
vLLM's shapes. Served only with GatewaySettings.allow_runtime_lora_updating (vLLM's
VLLM_ALLOW_RUNTIME_LORA_UPDATING); otherwise the paths are unknown (404). Behind the API key
like the rest of /v1/*.

    /v1/load_lora_adapter    {"lora_name": "sql", "lora_path": "/adapters/sql"}
                             200 text/plain "Success: LoRA adapter 'sql' added successfully."
    /v1/unload_lora_adapter  {"lora_name": "sql"}
                             200 text/plain "Success: LoRA adapter 'sql' removed successfully."

The engine does the work and owns the adapters (`EngineLike.loras`, gateway/engine_api.py);
GET /v1/models and a request's `model` see the change as soon as the answer is out. Errors
name their field (OpenAI's error shape):

    400  a missing or malformed field, a name already loaded (lora_adapter_exists), LoRA off
         in the engine (lora_disabled: start it with enable_lora), a folder the engine cannot
         read or that does not fit the model (invalid_lora_adapter, param lora_path)
    404  unloading a name that is not loaded (lora_adapter_not_found)
    409  unloading an adapter that requests still run on (lora_adapter_in_use)
    503  the engine has stopped
"""

from __future__ import annotations

import msgspec
import structlog
from aiohttp import web
from troupe.actors.engine_stopped import EngineStopped
from troupe.actors.lora_registry import LoraAdapterError
from troupe.config import ConfigError
from troupe.gateway.errors import ApiError
from troupe.gateway.http_body import read_json_body
from troupe.gateway.openai_bodies import decode_body
from troupe.gateway.state import GATEWAY, Gateway
from troupe.messages import LoraErrorCode

log = structlog.get_logger("troupe.gateway")

PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")

_STATUS = {LoraErrorCode.NOT_FOUND: 404, LoraErrorCode.IN_USE: 409}  # the rest: 400


class LoadBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    lora_name: str
    lora_path: str


class UnloadBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    lora_name: str


def add_lora_routes(app: web.Application) -> None:
    """Both routes, when the settings allow run-time updates."""
    if app[GATEWAY].settings.allow_runtime_lora_updating:
        app.router.add_post(PATHS[0], load_lora_adapter)
        app.router.add_post(PATHS[1], unload_lora_adapter)


async def load_lora_adapter(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = decode_body(await read_json_body(request, gateway.settings), LoadBody)
    _check_serving(gateway)
    try:
        await gateway.engine.loras.load(body.lora_name, body.lora_path)
    except (LoraAdapterError, ConfigError, EngineStopped) as exc:
        raise _error(exc) from None
    log.info("LoRA adapter loaded", name=body.lora_name, path=body.lora_path)
    return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = decode_body(await read_json_body(request, gateway.settings), UnloadBody)
    _check_serving(gateway)
    try:
        await gateway.engine.loras.unload(body.lora_name)
    except (LoraAdapterError, EngineStopped) as exc:
        raise _error(exc) from None
    log.info("LoRA adapter unloaded", name=body.lora_name)
    return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def _check_serving(gateway: Gateway) -> None:
    if not gateway.engine.is_healthy:
        raise _error(EngineStopped("the engine has stopped"))


def _error(exc: LoraAdapterError | ConfigError | EngineStopped) -> ApiError:
    if isinstance(exc, LoraAdapterError):
        status = _STATUS.get(exc.code, 400)
        return ApiError(status, str(exc), param=exc.field, code=exc.code.value)
    if isinstance(exc, ConfigError):  # the runner read the folder: it does not fit the model
        return ApiError(400, str(exc), param="lora_path", code="invalid_lora_adapter")
    return ApiError(503, f"the engine is not serving: {exc}", code="shutting_down")
