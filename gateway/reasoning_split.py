"""What a reasoning parser makes of a piece of an answer (gateway/reasoning.py,
gateway/harmony.py): its thinking and its content, None where it has none."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class Split:
    reasoning: str | None
    content: str | None


def joined(parts: list[str]) -> str | None:
    """The parts as one text, None when empty."""
    text = "".join(parts)
    return text or None
