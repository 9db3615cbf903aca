"""The router's knobs (`troupe router`, `troupe serve --data-parallel-size N`), checked on
construction. Names follow SGLang's router where the idea is the same."""

from __future__ import annotations

import dataclasses
import math
import urllib.parse

from troupe.config import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class RouterSettings:
    """How the router picks a replica and watches the replicas' health."""

    backend_urls: tuple[str, ...] = ()  # http(s)://host:port of each `troupe serve`
    # Prefix matched / prompt length at or above which a request follows its prefix.
    cache_threshold: float = 0.5
    # Loads (in-flight requests) count as imbalanced when max - min > balance_abs_threshold
    # and max > balance_rel_threshold * min; then the least loaded replica gets the request.
    balance_abs_threshold: int = 16
    balance_rel_threshold: float = 1.5
    max_tree_chars: int = 4_000_000  # per replica: remembered prompt characters
    health_check_interval_s: float = 2.0
    connect_timeout_s: float = 5.0  # to open a connection to a replica
    # For each run-time LoRA load replayed to a replica coming up (gateway/router_lora_ledger.py)
    lora_replay_timeout_s: float = 60.0
    max_body_bytes: int = 4 * 1024 * 1024  # request bodies above this get 413
    # Required of /v1/router/stats (it names the replicas); the replicas check their own routes.
    api_key: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend_urls", tuple(u.rstrip("/") for u in self.backend_urls))
        for url in self.backend_urls:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"backend_urls: {url!r} is not an http(s)://host:port URL")
        if len(set(self.backend_urls)) != len(self.backend_urls):
            raise ConfigError(f"backend_urls: a URL is listed twice: {self.backend_urls}")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ConfigError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0:
            raise ConfigError(
                f"balance_abs_threshold must be >= 0, got {self.balance_abs_threshold}"
            )
        if not self.balance_rel_threshold >= 1.0:
            raise ConfigError(
                f"balance_rel_threshold must be >= 1, got {self.balance_rel_threshold}"
            )
        if self.max_tree_chars < 1:
            raise ConfigError(f"max_tree_chars must be >= 1, got {self.max_tree_chars}")
        for name in ("health_check_interval_s", "connect_timeout_s", "lora_replay_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a number of seconds > 0, got {value}")
        if self.api_key is not None and not self.api_key:
            raise ConfigError("api_key must be non-empty when set")
        if self.max_body_bytes < 1:
            raise ConfigError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")

    def replace(self, **changes: object) -> RouterSettings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
