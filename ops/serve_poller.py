"""--poll-engine-stats: read /v1/engine/stats while the load runs, as the page's live view does.

Issue #15 asks that the live engine view cost the engine nothing measurable; running the same
load with and without this poller shows it. The first poll is awaited before the load starts, so
a run always reports at least one.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

import aiohttp


class StatsPoller:
    """Polls `base_url`/v1/engine/stats every `interval` seconds until the block exits."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        interval: float,
        api_key: str | None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"--poll-engine-stats must be > 0 s, got {interval:g}")
        self._session = session
        self._url = f"{base_url}/v1/engine/stats"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self.polls = 0
        self.failures: list[str] = []

    async def poll_once(self) -> None:
        try:
            async with self._session.get(self._url, headers=self._headers) as resp:
                await resp.read()
                if resp.status != 200:
                    self.failures.append(f"HTTP {resp.status}")
        except aiohttp.ClientError as exc:
            self.failures.append(repr(exc))
        self.polls += 1

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.poll_once()

    async def __aenter__(self) -> StatsPoller:
        await self.poll_once()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
