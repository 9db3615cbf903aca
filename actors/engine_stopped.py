"""EngineStopped, in a module of its own: the server's process (gateway/) raises and catches it
without importing the engine, and with it torch."""

from __future__ import annotations


class EngineStopped(RuntimeError):
    """The engine is closed or crashed; no more requests are taken."""
