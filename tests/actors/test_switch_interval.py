"""The engine holds the interpreter's switch interval while it runs and gives it back."""

from __future__ import annotations

import sys

import pytest
from troupe import Engine, EngineConfig
from troupe.actors.switch_interval import switch_interval
from troupe.config import ConfigError


def test_nested_holders_restore_what_the_first_found() -> None:
    before = sys.getswitchinterval()
    with switch_interval(0.001):
        assert sys.getswitchinterval() == pytest.approx(0.001)
        with switch_interval(0.0005):
            assert sys.getswitchinterval() == pytest.approx(0.0005)
        assert sys.getswitchinterval() == pytest.approx(0.0005)  # a holder is still open
        with switch_interval(None):
            assert sys.getswitchinterval() == pytest.approx(0.0005)
    assert sys.getswitchinterval() == pytest.approx(before)


@pytest.mark.anyio
async def test_engine_sets_the_interval_while_open() -> None:
    before = sys.getswitchinterval()
    config = EngineConfig(runner="fake", num_kv_blocks=64, gil_switch_interval_s=0.00025)
    async with Engine.open(config):
        assert sys.getswitchinterval() == pytest.approx(0.00025)
    assert sys.getswitchinterval() == pytest.approx(before)
    async with Engine.open(
        EngineConfig(runner="fake", num_kv_blocks=64, gil_switch_interval_s=None)
    ):
        assert sys.getswitchinterval() == pytest.approx(before)


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="gil_switch_interval_s must be > 0"):
        EngineConfig(gil_switch_interval_s=0.0)
