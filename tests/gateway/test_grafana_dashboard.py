"""ops/grafana_dashboard.json: the shape Grafana's dashboard model requires, and queries over
metrics that /metrics really exposes (names, labels, label values).

The structure is decoded into Structs that mirror Grafana's dashboard schema (schemaVersion
36 and later: panels with datasource refs, gridPos, targets), with unknown fields forbidden,
so a misspelt key fails here rather than being dropped silently by Grafana.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Any, Literal

import msgspec
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parents[2] / "ops" / "grafana_dashboard.json"
UNITS = {"reqps", "short", "s", "percentunit", "ops"}  # Grafana unit ids used here
BUILTINS = {"__rate_interval", "__interval", "__range"}
COUNTER_SUFFIXES = ("_total", "_count", "_bucket", "_sum")


class _Strict(msgspec.Struct, forbid_unknown_fields=True):
    pass


class DataSourceRef(_Strict):
    type: str
    uid: str


class GridPos(_Strict):
    h: int
    w: int
    x: int
    y: int


class Target(_Strict):
    refId: str
    expr: str
    datasource: DataSourceRef
    legendFormat: str = ""
    range: bool = True
    instant: bool = False


class FieldDefaults(msgspec.Struct):  # Grafana has many more: min, max, custom, thresholds
    unit: str


class FieldConfig(_Strict):
    defaults: FieldDefaults
    overrides: list[dict[str, Any]]


class Panel(_Strict):
    id: int
    type: Literal["timeseries", "stat", "gauge", "bargauge"]
    title: str
    datasource: DataSourceRef
    gridPos: GridPos
    targets: list[Target]
    fieldConfig: FieldConfig
    options: dict[str, Any]
    description: str = ""


class Variable(msgspec.Struct):
    name: str
    type: Literal["datasource", "query", "custom", "interval", "constant", "textbox"]
    query: str | dict[str, Any]


class Templating(_Strict):
    variables: list[Variable] = msgspec.field(name="list")


class TimeRange(_Strict):
    start: str = msgspec.field(name="from")
    to: str = "now"


class Dashboard(_Strict):
    id: None
    uid: str
    title: str
    schemaVersion: int
    version: int
    editable: bool
    graphTooltip: Literal[0, 1, 2]
    time: TimeRange
    templating: Templating
    annotations: dict[str, list[dict[str, Any]]]
    panels: list[Panel]
    refresh: str = ""
    tags: list[str] = []
    timezone: str = "browser"
    description: str = ""
    links: list[dict[str, Any]] = []
    fiscalYearStartMonth: int = 0
    liveNow: bool = False


def _load() -> Dashboard:
    return msgspec.json.decode(DASHBOARD.read_bytes(), type=Dashboard)


def test_dashboard_has_the_structure_grafana_requires() -> None:
    board = _load()
    assert board.schemaVersion >= 36 and board.title
    assert re.fullmatch(r"[A-Za-z0-9_-]{8,40}", board.uid)
    variables = {v.name: v for v in board.templating.variables}
    assert variables["datasource"].type == "datasource"
    assert variables["datasource"].query == "prometheus"
    assert board.panels, "no panels"
    assert len({p.id for p in board.panels}) == len(board.panels), "panel ids repeat"
    cells: dict[tuple[int, int], str] = {}
    for panel in board.panels:
        assert panel.title and panel.targets, panel.title
        assert panel.datasource == DataSourceRef(type="prometheus", uid="${datasource}")
        assert panel.fieldConfig.defaults.unit in UNITS, panel.title
        pos = panel.gridPos
        assert pos.h >= 1 and 1 <= pos.w and 0 <= pos.x and pos.x + pos.w <= 24, panel.title
        for x in range(pos.x, pos.x + pos.w):  # no two panels share a cell of the 24-wide grid
            for y in range(pos.y, pos.y + pos.h):
                assert (x, y) not in cells, f"{panel.title} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel.title
        ref_ids = [t.refId for t in panel.targets]
        assert len(set(ref_ids)) == len(ref_ids), panel.title
        for target in panel.targets:
            assert target.datasource == panel.datasource
            used = set(re.findall(r"\$\{?(\w+)", target.expr))
            assert used <= set(variables) | BUILTINS, (panel.title, used)
            assert _balanced(target.expr), target.expr


def _balanced(expr: str) -> bool:
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for char in re.sub(r'"[^"]*"', '""', expr):  # brackets inside label values do not count
        if char in "([{":
            stack.append(char)
        elif char in pairs and (not stack or stack.pop() != pairs[char]):
            return False
    return not stack


def _scrape(url: str) -> dict[str, list[dict[str, str]]]:
    """Sample name -> the label sets it is exposed with."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    samples: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(dict(sample.labels))
    return samples


def test_every_query_reads_an_exposed_metric(server) -> None:  # type: ignore[no-untyped-def]
    exposed = _scrape(server.url)
    board = _load()
    used: set[str] = set()
    for panel in board.panels:
        for target in panel.targets:
            names = re.findall(r"\btroupe_\w+", target.expr)
            assert names, f"{panel.title}: {target.expr} reads no troupe_ metric"
            for name, selector in re.findall(r"\b(troupe_\w+)(?:\{([^}]*)\})?", target.expr):
                assert name in exposed, f"{panel.title}: {name} is not in /metrics"
                used.add(name)
                _check_labels(name, selector, exposed[name])
            for name in re.findall(r"\b(?:rate|increase)\((troupe_\w+)", target.expr):
                assert name.endswith(COUNTER_SUFFIXES), f"rate() over a gauge: {name}"
            for name in re.findall(
                r"histogram_quantile\([^,]+, sum by \(le\) \(rate\((\w+)", target.expr
            ):
                assert name.endswith("_bucket"), name
            for label in re.findall(r"\bby \((\w+)\)", target.expr):
                assert any(label in labels for n in names for labels in exposed[n]), label
    # The figures the engine reports all have a panel.
    for family in ("troupe_requests_total", "troupe_kv_blocks_used", "troupe_preemptions_total",
                   "troupe_time_to_first_token_seconds_bucket", "troupe_prefix_cache_hit_tokens_total",
                   "troupe_inter_token_latency_seconds_bucket", "troupe_requests_waiting",
                   # vLLM's latency breakdown and token rates
                   "troupe_request_queue_time_seconds_bucket", "troupe_request_prefill_time_seconds_sum",
                   "troupe_request_decode_time_seconds_count", "troupe_generation_tokens_total",
                   "troupe_prompt_tokens_total", "troupe_iteration_tokens_total_bucket"):  # fmt: skip
        assert family in used, family


def _check_labels(name: str, selector: str, label_sets: list[dict[str, str]]) -> None:
    """Each matcher names a label the metric has (Prometheus adds instance and job) and, for
    an exact match, a value it takes."""
    for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', selector):
        if label in ("instance", "job"):
            continue
        values = {labels.get(label) for labels in label_sets}
        assert values != {None}, f"{name} has no label {label}"
        if op == "=":
            assert value in values, f"{name}{{{label}={value!r}}} is never exposed"
