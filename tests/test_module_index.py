"""docs/architecture.md's module index lists every module of the package, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {"tests", ".venv", "build", "artifacts", "static"}


def _modules() -> set[str]:
    """Every .py file of the package but tests, __init__ files and ignored folders."""
    found = set()
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in SKIP or rel.parts[0].startswith(".") or path.name == "__init__.py":
            continue
        found.add(rel.as_posix())
    return found


def _indexed() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    index = text.split("\n## Module index\n", 1)[1]
    return re.findall(r"^- `([^`]+\.py)`", index, flags=re.M)


def test_every_module_is_in_the_index_once() -> None:
    listed = _indexed()
    assert len(listed) == len(set(listed)), "a module is listed twice"
    missing = sorted(_modules() - set(listed))
    assert not missing, f"add these to docs/architecture.md's module index: {missing}"


def test_the_index_lists_no_module_that_is_gone() -> None:
    gone = sorted(set(_indexed()) - _modules())
    assert not gone, f"docs/architecture.md's module index lists modules that are gone: {gone}"
