"""The run-time LoRA loads the router made on every replica, remembered so that a replica that
(re)joins gets them too.

    POST /v1/load_lora_adapter    200 from every replica ─► remember(name, body, headers)
    POST /v1/unload_lora_adapter  200 from some replica  ─► forget(name)
    a replica comes up            ─► replay(session, url), before the ReplicaSet marks it up
      (gateway/router_replicas.py: down to up, or a new home_id: restarted between two checks)
        each remembered load POSTed to it, one after another, oldest first
          200, or 400 lora_adapter_exists  it has the adapter (a replica that was only
                                           unreachable kept it)
          503, or not reached              the replay stops; the replica stays down and the
                                           next health check tries again
          anything else                    a failure (logged): it comes up without that
                                           adapter, which /v1/models (what every up replica
                                           lists) then leaves out

Bounded: one entry per adapter that every replica loaded through the router (its body at most
max_body_bytes), so no more than each replica holds itself; an unload forgets. A load keeps the
headers it came with (its Authorization): the replicas check keys, and a replay has no client.
Only what goes through the router is known: an adapter unloaded straight from every replica is
still replayed.
"""

from __future__ import annotations

import dataclasses

import aiohttp
from troupe.gateway.router_answers import READ_ERRORS, ReplicaAnswer

LOAD = "/v1/load_lora_adapter"
_EXISTS = "lora_adapter_exists"  # messages.LoraErrorCode.EXISTS, as a replica answers it


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Load:
    body: bytes
    headers: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Replay:
    """How a replay to one replica went."""

    num_loaded: int  # adapters it has now (loaded, or kept)
    failures: tuple[str, ...] = ()  # the loads it refused: "name: what it answered"
    unreachable: str = ""  # why the replay stopped early (not reached, or a 503)


class LoraLedger:
    """Adapter name -> the load that put it on every replica, oldest first."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._loads: dict[str, _Load] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._loads)

    def remember(self, name: str, body: bytes, headers: dict[str, str]) -> None:
        self._loads.pop(name, None)  # loaded again (after unloads past the router): newest
        self._loads[name] = _Load(body=body, headers=tuple(headers.items()))

    def forget(self, name: str) -> None:
        self._loads.pop(name, None)

    async def replay(self, session: aiohttp.ClientSession, url: str) -> Replay:
        """POST every remembered load to the replica at `url`; how it went."""
        num_loaded = 0
        failures: list[str] = []
        for name, load in list(self._loads.items()):  # a copy: loads may come meanwhile
            try:
                async with session.post(
                    f"{url}{LOAD}",
                    data=load.body,
                    headers=dict(load.headers),
                    timeout=self._timeout,
                ) as resp:
                    answer = ReplicaAnswer(
                        url=url,
                        status=resp.status,
                        body=await resp.read(),
                        content_type=resp.content_type,
                    )
            except READ_ERRORS as exc:
                why = f"its {LOAD} of {name!r} failed: {exc!r}"
                return Replay(num_loaded=num_loaded, failures=tuple(failures), unreachable=why)
            if answer.status == 503:  # draining or failed: not up, whatever /health said
                why = f"its {LOAD} of {name!r} answered 503: {answer.error()[0]}"
                return Replay(num_loaded=num_loaded, failures=tuple(failures), unreachable=why)
            if answer.is_ok or answer.error()[2] == _EXISTS:
                num_loaded += 1
            else:
                failures.append(f"{name}: {answer.describe()}")
        return Replay(num_loaded=num_loaded, failures=tuple(failures))
