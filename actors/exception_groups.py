"""Task groups wrap every failure in an ExceptionGroup; callers expect the failure itself."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


def single_leaf(exc: BaseException) -> BaseException | None:
    """The one exception inside (possibly nested) exception groups; None if there are more."""
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc


@contextmanager
def unwrap_single() -> Iterator[None]:
    """Re-raise a task group's lone exception as itself (callers catch ModelLoadError, not an
    ExceptionGroup around it); groups of several stay groups."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaf = single_leaf(group)
        if leaf is None:
            raise
        raise leaf from leaf.__cause__
