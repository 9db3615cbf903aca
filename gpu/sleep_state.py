"""What sleeps and at which level: the bookkeeping both Sleepers answer from (the model
runner's gpu/sleep_mode.py, the fake runner's gpu/fake_sleep.py)."""

from __future__ import annotations

from troupe.messages.sleep_calls import ALL_TAGS, SleepTag


class SleepRefused(ValueError):
    """A sleep that cannot be done, refused before anything is freed (the reason names what)."""


class SleepState:
    """A sleep puts every tag to sleep at one level; wake-ups take tags back one call at a
    time, and the level is 0 again once none sleeps."""

    def __init__(self) -> None:
        self._sleeping: set[SleepTag] = set()
        self.level = 0

    @property
    def sleeping(self) -> tuple[SleepTag, ...]:
        """What sleeps now, in ALL_TAGS order; () when awake."""
        return tuple(t for t in ALL_TAGS if t in self._sleeping)

    def fall_asleep(self, level: int) -> None:
        self._sleeping, self.level = set(ALL_TAGS), level

    def wake(self, tags: tuple[SleepTag, ...]) -> bool:
        """`tags` awake; whether nothing sleeps any more."""
        self._sleeping -= set(tags)
        if not self._sleeping:
            self.level = 0
        return not self._sleeping
