"""OpenAI `tools` entries for the tool-call tests (parsers, streaming, HTTP)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def function_tool(
    name: str, properties: dict[str, Any] | None = None, required: Sequence[str] = ()
) -> dict[str, Any]:
    """A chat `tools` entry: the function `name` whose parameters are an object of
    `properties`, `required` ones listed (properties None: no parameters at all)."""
    function: dict[str, Any] = {"name": name}
    if properties is not None:
        parameters: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            parameters["required"] = list(required)
        function["parameters"] = parameters
    return {"type": "function", "function": function}


# get_weather(city: str, days: int): the HTTP tests' one tool
WEATHER = function_tool("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}})
