"""Imports run down the floors only: a module imports from its own floor or below. The floors,
lowest first (DESIGN: messages are the contracts; config names every knob and sits below the
code it configures; the gateway and ops drive the engine from above)."""

from __future__ import annotations

import ast
from pathlib import Path

import troupe

FLOORS: list[set[str]] = [
    {"messages", "kernels", "logs", "gguf_file", "request_seeds", "child_processes"},
    {"policies"},
    {"config", "config_checks", "config_pipeline", "model_path", "speculators_format"},
    {"spec_cost"},
    {"gpu"},
    {"actors/core"},
    {"actors"},
    {"troupe"},  # the package's face: Engine, SamplingParams, the events
    {"gateway"},
    {"ops"},
    {"__main__"},  # `python -m troupe`
]
FLOOR = {unit: level for level, units in enumerate(FLOORS) for unit in units}
ROOT = Path(troupe.__file__).parent


def _unit(parts: list[str]) -> str:
    if not parts or parts == ["__init__"]:
        return "troupe"
    if parts[0] == "actors" and len(parts) > 1 and parts[1] == "core":
        return "actors/core"
    return parts[0]


def _imports(tree: ast.Module) -> list[str]:
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [m for m in found if m == "troupe" or m.startswith("troupe.")]


def _package_files() -> list[Path]:
    """The package's .py files: not the tests, nor ignored folders (scratch in artifacts/, build
    output, the virtual environment)."""
    skip = {"tests", "_gpu", "artifacts", "build", ".venv"}
    return [p for p in sorted(ROOT.rglob("*.py")) if p.relative_to(ROOT).parts[0] not in skip]


def upward_imports() -> list[str]:
    bad = []
    for path in _package_files():
        rel = path.relative_to(ROOT)
        unit = _unit(list(rel.with_suffix("").parts))
        for module in _imports(ast.parse(path.read_text(), str(path))):
            target = _unit(module.split(".")[1:])
            if target != unit and FLOOR[target] > FLOOR[unit]:
                bad.append(f"{rel} ({unit}) imports {module} ({target})")
    return bad


def test_every_package_has_a_floor() -> None:
    units = {_unit(list(p.relative_to(ROOT).with_suffix("").parts)) for p in _package_files()}
    assert units <= set(FLOOR), f"place these in FLOORS: {sorted(units - set(FLOOR))}"


def test_imports_run_down_the_floors() -> None:
    assert upward_imports() == []
