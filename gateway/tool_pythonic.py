"""tool_choice "auto" for pythonic calls (vLLM's `--tool-call-parser pythonic`): Llama 3.2 and
Llama 4 (and ToolACE-style models) answer a call as a Python list of calls,

    [get_weather(city="Paris"), get_time(tz="CET", hour24=True)]

maybe wrapped in Llama 4's `<|python_start|>` ... `<|python_end|>`. A reply is calls when it
starts (after whitespace) with `[` or that tag and is, whole, one such list: read with
Python's `ast` (never evaluated), each call a known tool's name with keyword arguments whose
values are literals (strings, numbers, True/False/None, lists, dicts; a negative number too,
which vLLM refuses). Then it has no content. Anything else, a positional argument included
(vLLM drops those silently; troupe will not call a tool without them), is plain text. Ids are
vLLM's (`chatcmpl-tool-` and 32 hex digits). Streamed, a call opens at `name(` and each
keyword argument goes out as a JSON member once written whole (gateway/python_call_scan.py).
"""

from __future__ import annotations

import ast
import json
from typing import Any

from troupe.gateway.tool_format import (
    CallFormat,
    ToolCallDict,
    ToolSchemas,
    make_call,
    vllm_call_id,
)

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"


class NotLiteral(ValueError):
    pass


def parse_pythonic(section: str, tools: ToolSchemas) -> list[ToolCallDict] | None:
    """The calls of a reply that is one Python list of calls; None if it is anything else."""
    source = section.strip()
    if source.startswith(PYTHON_START):
        source = source[len(PYTHON_START) :].removesuffix(PYTHON_END).strip()
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError):  # ValueError: a NUL byte
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        if node.func.id not in tools.names:
            return None
        try:
            args = {_keyword(k): literal_value(k.value) for k in node.keywords}
            arguments = json.dumps(args, ensure_ascii=False, allow_nan=False)
        except (NotLiteral, ValueError, RecursionError):
            return None
        calls.append(make_call(vllm_call_id(), node.func.id, arguments))
    return calls


def _keyword(keyword: ast.keyword) -> str:
    if keyword.arg is None:  # **kwargs
        raise NotLiteral("** arguments are not literals")
    return keyword.arg


def literal_value(node: ast.expr) -> Any:
    """The JSON value of a literal expression; NotLiteral for anything else."""
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, bool | int | float | str):
            return node.value
        raise NotLiteral(f"{node.value!r} has no JSON form")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = literal_value(node.operand)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise NotLiteral("a sign before something not a number")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List | ast.Tuple):
        return [literal_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if not isinstance(key, ast.Constant) or not isinstance(key.value, str):
                raise NotLiteral("dict keys must be strings")
            out[key.value] = literal_value(value)
        return out
    raise NotLiteral(f"{type(node).__name__} is not a literal")


PYTHONIC = CallFormat(("[", PYTHON_START), parse_pythonic, lead_only=True)
