"""Which replica serves a request: follow the prefix while loads are balanced, else the load.

    loads imbalanced?  (max - min > balance_abs_threshold and max > balance_rel_threshold * min)
      yes -> the least loaded replica                                   (reason "load")
      no  -> best = the replica whose tree matches the most of the prompt
             matched / len(prompt) >= cache_threshold -> best           (reason "prefix": a hit)
             else -> the least loaded, then the smallest tree           (reason "spread")

"spread" sends unrelated prompts where the least is remembered, so they alternate between
replicas even one at a time, and the next prompt of the same family then follows its prefix.
Whatever the reason, the prompt is remembered in the chosen replica's tree.

Pure and synchronous: loads and which replicas are up are passed in by the caller.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from troupe.gateway.prefix_tree import PrefixTree
from troupe.gateway.router_settings import RouterSettings


class RouteReason(enum.Enum):
    PREFIX = "prefix"  # the replica most likely to hold the prompt's prefix
    SPREAD = "spread"  # no replica holds enough of it: least loaded, least remembered
    LOAD = "load"  # loads were imbalanced: the least loaded


@dataclass(frozen=True, kw_only=True)
class Route:
    replica: int
    reason: RouteReason
    matched_chars: int  # of the prompt, in the chosen replica's tree before this request


class CacheAwarePolicy:
    """One prefix tree per replica; `choose` picks among the replicas that are up."""

    def __init__(self, num_replicas: int, settings: RouterSettings) -> None:
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        self._settings = settings
        self.trees = [PrefixTree(settings.max_tree_chars) for _ in range(num_replicas)]

    def choose(self, key: str, loads: Sequence[int], is_up: Sequence[bool]) -> Route | None:
        """The replica for a prompt `key`; None when no replica is up. Remembers the key."""
        assert len(loads) == len(is_up) == len(self.trees), "one load and flag per replica"
        up = [i for i, ok in enumerate(is_up) if ok]
        if not up:
            return None
        route = self._pick(key, loads, up)
        self.trees[route.replica].insert(key)
        return route

    def _pick(self, key: str, loads: Sequence[int], up: list[int]) -> Route:
        s = self._settings
        lo, hi = min(loads[i] for i in up), max(loads[i] for i in up)
        if hi - lo > s.balance_abs_threshold and hi > s.balance_rel_threshold * lo:
            best = min(up, key=lambda i: (loads[i], self.trees[i].num_chars, i))
            return Route(
                replica=best, reason=RouteReason.LOAD, matched_chars=self._match(best, key)
            )
        matched = {i: self.trees[i].match(key) for i in up}
        best = min(up, key=lambda i: (-matched[i], loads[i], i))
        if key and matched[best] > 0 and matched[best] / len(key) >= s.cache_threshold:
            return Route(replica=best, reason=RouteReason.PREFIX, matched_chars=matched[best])
        spread = min(up, key=lambda i: (loads[i], self.trees[i].num_chars, i))
        return Route(replica=spread, reason=RouteReason.SPREAD, matched_chars=matched[spread])

    def _match(self, replica: int, key: str) -> int:
        return self.trees[replica].match(key)
