"""What `troupe bench soak` checks once the workload is over, each as a named pass/fail line.

- every request ended exactly once: one terminal event (a finish_reason or an error, `[DONE]`
  after it, a websocket `done`/`error` frame), or the client's own deliberate cut;
- the server holds nothing for them: /metrics shows no KV block in use (GPU and CPU pools)
  and no request running, waiting or swapped;
- the server process did not grow: RSS and open file descriptors, from a baseline taken after a
  warm-up to the end, each within a limit (only when the pid is known: /proc on this host).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# `name{label="value",...} 1.0` (the Prometheus text format, as prometheus-client writes it).
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

# Gauges that must read 0 when no request is in flight: (name, labels). A sample matches when
# it has these labels, whatever others it carries (troupe's model_name); matches add up.
IDLE_GAUGES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("troupe_kv_blocks_used", (("pool", "gpu"),)),
    ("troupe_kv_blocks_used", (("pool", "cpu"),)),
    ("troupe_requests_running", ()),
    ("troupe_requests_waiting", ()),
    ("troupe_requests_swapped", ()),
)


# Error codes that mean the server broke, not that the request was refused.
SERVER_FAULTS = ("internal_error", "failed")


@dataclass(frozen=True)
class Check:
    name: str
    value: str
    is_ok: bool


@dataclass(frozen=True)
class ProcessSample:
    rss_bytes: int
    num_fds: int


@dataclass(frozen=True)
class Outcome:
    """How one request ended, as the client saw it."""

    kind: str
    ending: str  # "finished" | "aborted" (a cancel won) | "error" | "cut" | "lost"
    num_terminal: int  # terminal events seen: 1 expected; 0 for a cut before any
    seconds: float
    detail: str = ""  # why it is lost, or the error code

    @property
    def is_loss(self) -> bool:
        return (
            self.ending == "lost"
            or self.num_terminal > 1
            or (self.ending == "error" and self.detail in SERVER_FAULTS)
        )


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples of a Prometheus text page, keyed by (name, sorted labels)."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        key = tuple(sorted(_LABEL.findall(labels or "")))
        samples[(name, key)] = float(value)
    return samples


def _sum_matching(
    samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    name: str,
    labels: tuple[tuple[str, str], ...],
) -> float | None:
    """The sum of `name`'s samples that carry `labels` (None: there is none)."""
    values = [
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and set(labels) <= set(sample_labels)
    ]
    return sum(values) if values else None


def is_idle(metrics_text: str) -> bool:
    """True when every idle gauge reads 0 (what the settle loop waits for)."""
    return all(check.is_ok for check in check_metrics(metrics_text))


def check_metrics(metrics_text: str) -> list[Check]:
    """One check per idle gauge; a gauge missing from the page fails too."""
    samples = parse_metrics(metrics_text)
    checks = []
    for name, labels in IDLE_GAUGES:
        value = _sum_matching(samples, name, labels)
        shown = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else "")
        if value is None:
            checks.append(Check(f"{shown} == 0", "missing", False))
        else:
            checks.append(Check(f"{shown} == 0", f"{value:g}", value == 0))
    return checks


def check_process(
    before: ProcessSample, after: ProcessSample, *, max_rss_growth_mb: float, max_fd_growth: int
) -> list[Check]:
    rss_growth_mb = (after.rss_bytes - before.rss_bytes) / 2**20
    fd_growth = after.num_fds - before.num_fds
    return [
        Check(
            f"server RSS growth <= {max_rss_growth_mb:g} MB",
            f"{before.rss_bytes / 2**20:.0f} -> {after.rss_bytes / 2**20:.0f} MB "
            f"({rss_growth_mb:+.1f})",
            rss_growth_mb <= max_rss_growth_mb,
        ),
        Check(
            f"server open FDs growth <= {max_fd_growth}",
            f"{before.num_fds} -> {after.num_fds} ({fd_growth:+d})",
            fd_growth <= max_fd_growth,
        ),
    ]


def check_outcomes(outcomes: Sequence[Outcome], num_expected: int) -> list[Check]:
    lost = [o for o in outcomes if o.ending == "lost"]
    doubled = [o for o in outcomes if o.num_terminal > 1]
    failed = [o for o in outcomes if o.ending == "error" and o.detail in SERVER_FAULTS]
    return [
        Check(
            "every request accounted for",
            f"{len(outcomes)}/{num_expected}",
            len(outcomes) == num_expected,
        ),
        Check("no request lost (0 terminal events)", f"{len(lost)}", not lost),
        Check("no request with 2+ terminal events", f"{len(doubled)}", not doubled),
        Check("no server fault (internal_error, failed)", f"{len(failed)}", not failed),
    ]


def sample_process(pid: int) -> ProcessSample:
    """RSS and open FDs of process `pid`, from /proc."""
    rss_kib = 0
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
    return ProcessSample(rss_bytes=rss_kib * 1024, num_fds=len(os.listdir(f"/proc/{pid}/fd")))


def losses(outcomes: Iterable[Outcome], limit: int = 10) -> list[str]:
    """The first few lost or doubled requests, for the report."""
    found = [
        f"{o.kind}: {o.ending}, {o.num_terminal} terminal ({o.detail})"
        for o in outcomes
        if o.is_loss
    ]
    return found[:limit]


def summarize(outcomes: Sequence[Outcome]) -> Mapping[str, Mapping[str, float]]:
    """Per kind: counts of each ending, losses, and latency percentiles (ms)."""
    table: dict[str, dict[str, float]] = {}
    for kind in sorted({o.kind for o in outcomes}):
        rows = [o for o in outcomes if o.kind == kind]
        times = sorted(o.seconds for o in rows)
        table[kind] = {
            "n": len(rows),
            **{
                ending: sum(o.ending == ending for o in rows)
                for ending in ("finished", "aborted", "error", "cut", "lost")
            },
            "doubled": sum(o.num_terminal > 1 for o in rows),
            "p50_ms": 1000 * times[len(times) // 2],
            "p99_ms": 1000 * times[min(len(times) - 1, int(len(times) * 0.99))],
        }
    return table
