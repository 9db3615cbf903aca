"""OpenAI Batch API files: request lines in, answer lines out, in order (`troupe run-batch`).

Input, one JSON object a line (blank lines are skipped):

    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

Output, one line per request line, in input order:

    {"id": "batch_req_<hex>", "custom_id": "r1",
     "response": {"status_code": 200, "request_id": "chatcmpl-<hex>", "body": {...}},
     "error": null}

`body` is what the HTTP endpoint answers; `request_id` is the body's `id` (the engine's request
id, which the logs carry), or a fresh `req_<hex>` for an error. A failed request keeps its
status and the HTTP error body (`{"error": {"message", "type", "param", "code"}}`) in
`response`, and `error` is {"code", "message"}, so `error != null` picks the failures out. A
line that is no request (not JSON, a field missing or mistyped, a method other than POST, a url
not served, a custom_id used before) is answered the same way, status 400 naming the field
(`param`), with its custom_id where one could be read.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Collection
from typing import Any

import msgspec
from troupe.gateway.errors import ApiError, invalid
from troupe.gateway.json_calls import Answer

_json = msgspec.json.Encoder()


class BatchLine(msgspec.Struct, frozen=True):
    """One request of the input file; `body` stays the bytes the endpoint's parser reads."""

    custom_id: str
    method: str
    url: str
    body: msgspec.Raw


class Refused(msgspec.Struct, frozen=True):
    """A line that is no request, and its answer."""

    custom_id: str | None
    answer: Answer


class LineReader:
    """Checks each line; remembers the custom_ids seen (OpenAI requires them unique)."""

    def __init__(self, urls: Collection[str]) -> None:
        self._urls = urls
        self._first_use: dict[str, int] = {}  # custom_id -> the line it came on

    def read(self, raw: bytes, number: int) -> BatchLine | Refused:
        """The request on line `number` (from 1), or why it is none."""
        try:
            line = msgspec.json.decode(raw, type=BatchLine)
        except msgspec.ValidationError as exc:  # JSON, not a request (a DecodeError too)
            message, param = f"line {number}: {exc}", _field(str(exc))
            error = ApiError(400, message, param=param, code="invalid_value")
            return _refused(_custom_id(raw), error)
        except msgspec.DecodeError as exc:
            error = ApiError(400, f"line {number} is not JSON: {exc}", code="invalid_json")
            return _refused(None, error)
        if line.method != "POST":
            message = f"line {number}: method must be POST, got {line.method!r:.40}"
            return _refused(line.custom_id, invalid("method", message))
        if line.url not in self._urls:
            served = ", ".join(sorted(self._urls))
            message = f"line {number}: url {line.url!r:.80} is not served (served: {served})"
            return _refused(line.custom_id, invalid("url", message))
        if (first := self._first_use.setdefault(line.custom_id, number)) != number:
            message = f"line {number}: custom_id {line.custom_id!r:.80} is line {first}'s too"
            return _refused(line.custom_id, invalid("custom_id", message))
        return line


def output_line(custom_id: str | None, answer: Answer) -> bytes:
    """The output file's line for one request's answer."""
    error = answer.error
    request_id = answer.body.get("id") if error is None else None
    line = {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": {
            "status_code": answer.status,
            "request_id": request_id if isinstance(request_id, str) else f"req_{uuid.uuid4().hex}",
            "body": answer.body,
        },
        "error": None
        if error is None
        else {"code": error.get("code") or error.get("type"), "message": error.get("message")},
    }
    return _json.encode(line) + b"\n"


class OrderedWriter:
    """Writes each line's answer once every line before it is written; holds the others (the
    answers of lines after one still running)."""

    def __init__(self, write: Callable[[bytes], object], flush: Callable[[], object]) -> None:
        self._write = write
        self._flush = flush
        self._held: dict[int, bytes] = {}
        self.num_written = 0  # also the index of the next line to write

    @property
    def num_held(self) -> int:
        return len(self._held)

    def put(self, index: int, data: bytes) -> None:
        """Line `index`'s output (each index from 0 once)."""
        assert index >= self.num_written and index not in self._held, f"line {index} twice"
        self._held[index] = data
        if index != self.num_written:
            return
        while (ready := self._held.pop(self.num_written, None)) is not None:
            self._write(ready)
            self.num_written += 1
        self._flush()  # a reader of the output (a pipe, `tail -f`) sees each answer as it lands


def _refused(custom_id: str | None, error: ApiError) -> Refused:
    return Refused(custom_id, Answer(status=error.status, body=error.body()))


def _custom_id(raw: bytes) -> str | None:
    """A malformed line's custom_id, if it has a readable one."""
    try:
        value: Any = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    custom_id = value.get("custom_id") if isinstance(value, dict) else None
    return custom_id if isinstance(custom_id, str) else None


_AT_FIELD = re.compile(r"at `\$\.(\w+)")
_MISSING = re.compile(r"missing required field `(\w+)`")


def _field(message: str) -> str | None:
    """The field msgspec's validation error names ("... - at `$.url`"); None for the line."""
    found = _AT_FIELD.search(message) or _MISSING.search(message)
    return found.group(1) if found else None
