"""The router's replicas: who is up, what each has in flight, and the counts per replica.

`ReplicaSet` owns these facts (the policy owns the prefix trees). A replica is up after its
`/health` answers 200 and down after it answers anything else or cannot be reached, or after a
proxied request finds it refusing connections or cutting a stream (the health loop brings it
back). A 503 to a proxied request (draining, failed, or only at its connection cap) triggers a
health check at once, which decides. Only replicas that are up get traffic.

`/health` also names the replica's `home_id`, which the ids of the responses it stores carry
(gateway/responses_store.py): `holder_of(response_id)` is the replica holding a stored response.
A replica that restarts has a new one (its store is gone), learnt at its next health check.

A replica that comes up (down to up, or up under a new `home_id`: restarted between two
checks) first gets the run-time LoRA loads the router remembers (`loras`,
gateway/router_lora_ledger.py), then is marked up: it takes no traffic before it serves the
adapters the others do. One it cannot be reached for stays down until a later check.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass

import aiohttp
import structlog
from troupe.gateway.responses_store import home_of
from troupe.gateway.router_lora_ledger import LoraLedger
from troupe.gateway.router_policy import CacheAwarePolicy, Route, RouteReason
from troupe.gateway.router_settings import RouterSettings

log = structlog.get_logger("troupe.router")


@dataclass(kw_only=True)
class Replica:
    """One `troupe serve` behind the router, and what the router counted for it."""

    index: int
    url: str
    is_up: bool = False
    num_in_flight: int = 0  # requests proxied and not yet ended: the load the policy balances
    num_routed: int = 0
    num_prefix_hits: int = 0
    num_failures: int = 0  # refused connections, 503s, streams cut by the replica
    home_id: str | None = None  # its /health's, kept while it is down


class NoReplicaUp(Exception):
    """Every replica is down (or already tried for this request)."""


class ReplicaSet:
    """The replicas, the policy over them, and the loop that checks their health."""

    def __init__(self, settings: RouterSettings) -> None:
        if not settings.backend_urls:
            raise ValueError("the router needs at least one backend URL")
        self.settings = settings
        self.replicas = [Replica(index=i, url=u) for i, u in enumerate(settings.backend_urls)]
        self.policy = CacheAwarePolicy(len(self.replicas), settings)
        self.loras = LoraLedger(settings.lora_replay_timeout_s)

    def route(self, key: str, exclude: set[int]) -> Replica:
        """Choose a replica for prompt `key` (not one of `exclude`) and count it in flight."""
        loads = [r.num_in_flight for r in self.replicas]
        is_up = [r.is_up and r.index not in exclude for r in self.replicas]
        route: Route | None = self.policy.choose(key, loads, is_up)
        if route is None:
            down = [r.url for r in self.replicas if not r.is_up]
            raise NoReplicaUp(
                f"no replica is up to take the request ({len(self.replicas)} configured; "
                f"down: {', '.join(down) or 'none'}; tried: {len(exclude)})"
            )
        replica = self.replicas[route.replica]
        replica.num_routed += 1
        replica.num_prefix_hits += route.reason is RouteReason.PREFIX
        replica.num_in_flight += 1
        return replica

    def take(self, replica: Replica) -> None:
        """Count a request sent to `replica` by its home (no policy choice) in flight."""
        replica.num_routed += 1
        replica.num_in_flight += 1

    def holder_of(self, response_id: str) -> Replica | None:
        """The replica whose store holds `response_id` (up or not); None when no replica's
        home id is in it."""
        home = home_of(response_id)
        if home is None:
            return None
        return next((r for r in self.replicas if r.home_id == home), None)

    def release(self, replica: Replica) -> None:
        replica.num_in_flight -= 1

    def mark(self, replica: Replica, is_up: bool, why: str) -> None:
        if replica.is_up != is_up:
            log.info("replica up" if is_up else "replica down", url=replica.url, reason=why)
            replica.is_up = is_up

    def fail(self, replica: Replica, why: str, *, is_down: bool = True) -> None:
        """A proxied request found the replica failing: count it and, when it is down (refused,
        unreachable, a stream cut), take it out of rotation until a health check passes."""
        replica.num_failures += 1
        if is_down:
            self.mark(replica, False, why)

    @property
    def num_up(self) -> int:
        return sum(r.is_up for r in self.replicas)

    async def check_all(self, session: aiohttp.ClientSession) -> None:
        """One round of `/health` checks, all replicas at once."""
        await asyncio.gather(*(self.check(session, r) for r in self.replicas))

    async def check(self, session: aiohttp.ClientSession, replica: Replica) -> None:
        """Ask one replica's `/health`: up on 200 (once a replica coming up has the run-time
        LoRA loads), down otherwise."""
        timeout = aiohttp.ClientTimeout(total=self.settings.connect_timeout_s)
        try:
            async with session.get(f"{replica.url}/health", timeout=timeout) as resp:
                status = resp.status
                text = await resp.read() if status == 200 else b""
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.mark(replica, False, f"health check failed: {exc!r}")
            return
        if status == 200:
            home_id, known = _home_id(text), replica.home_id
            replica.home_id = home_id
            if replica.is_up and known is not None and home_id != known:
                self.mark(replica, False, f"restarted (home_id {known} is now {home_id})")
            if not replica.is_up and not await self._rejoin(session, replica):
                return
        self.mark(replica, status == 200, f"/health answered {status}")

    async def _rejoin(self, session: aiohttp.ClientSession, replica: Replica) -> bool:
        """Replay the remembered LoRA loads to a replica coming up; False (it stays down)
        when it could not be reached."""
        if not self.loras.names:
            return True
        replay = await self.loras.replay(session, replica.url)
        for failure in replay.failures:
            log.warning("LoRA adapter not replayed", url=replica.url, failure=failure)
        if replay.unreachable:
            self.mark(replica, False, f"LoRA replay stopped: {replay.unreachable}")
            return False
        log.info("LoRA adapters replayed", url=replica.url, num_loaded=replay.num_loaded)
        return True

    async def run_health_checks(self, session: aiohttp.ClientSession) -> None:
        """Check every `health_check_interval_s` until cancelled."""
        while True:
            await asyncio.sleep(self.settings.health_check_interval_s)
            with contextlib.suppress(Exception):  # one bad round must not stop the loop
                await self.check_all(session)


def _home_id(health: bytes) -> str | None:
    """The `home_id` of a /health answer (None: not a troupe gateway's, or one that stores
    no responses under a home)."""
    try:
        body = json.loads(health)
    except ValueError:
        return None
    home = body.get("home_id") if isinstance(body, dict) else None
    return home if isinstance(home, str) else None
