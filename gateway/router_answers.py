"""A replica's answer to a request the router sent it on its own behalf (not proxied): a
fanned-out LoRA load or unload (gateway/router_loras.py), or a replayed load
(gateway/router_lora_ledger.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import aiohttp

# What a replica's failure can raise while the router asks it
READ_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)
_MAX_QUOTED_CHARS = 300  # of a replica's non-JSON error body, in the router's message


@dataclass(frozen=True, kw_only=True)
class ReplicaAnswer:
    """One replica's answer (a replica the router could not ask gets a made-up 503)."""

    url: str
    status: int
    body: bytes
    content_type: str
    why_not_sent: str = ""  # set when the router answered for the replica

    @property
    def is_ok(self) -> bool:
        return self.status == 200

    def error(self) -> tuple[str, str | None, str | None]:
        """(message, param, code) of a failure: the replica's OpenAI error, or its text."""
        try:
            error = json.loads(self.body)["error"]
            return str(error["message"]), error.get("param"), error.get("code")
        except (ValueError, KeyError, TypeError):
            return self.body.decode(errors="replace")[:_MAX_QUOTED_CHARS], None, None

    def describe(self) -> str:
        """The replica and what it answered, for the router's error message."""
        if self.why_not_sent:
            return f"{self.url} {self.why_not_sent} (counted as {self.status})"
        return f"{self.url} answered {self.status}: {self.error()[0]}"


def made_up(url: str, why: str) -> ReplicaAnswer:
    """A 503 the router answers for a replica it could not ask."""
    return ReplicaAnswer(url=url, status=503, body=b"", content_type="", why_not_sent=why)
