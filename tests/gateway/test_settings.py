"""GatewaySettings: validation names the field; one `troupe serve` flag per field."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest
from troupe.config import ConfigError
from troupe.gateway.server import add_serve_arguments
from troupe.gateway.settings import GatewaySettings, canonical_origin, settings_from_args


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"max_connections": 0}, "max_connections"),
        ({"header_timeout": 0.0}, "header_timeout"),
        ({"keepalive_timeout": -1.0}, "keepalive_timeout"),
        ({"body_timeout": float("inf")}, "body_timeout"),
        ({"ws_heartbeat": 0.0}, "ws_heartbeat"),
        ({"api_key": ""}, "api_key"),
        ({"allowed_origins": ("https://a.example/path",)}, "allowed_origins"),
        ({"allowed_origins": ("null",)}, "allowed_origins"),
        ({"served_model_name": ("gpt-x", " ")}, "served_model_name"),
        ({"served_model_name": ("gpt-x", "a", "gpt-x")}, "served_model_name"),
        ({"return_tokens_as_token_ids": "yes"}, "return_tokens_as_token_ids"),
    ],
)
def test_bad_settings_name_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        GatewaySettings(**changes)


def test_every_field_is_a_flag() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert settings_from_args(parser.parse_args([])) == GatewaySettings()
    args = parser.parse_args(
        ["--allowed-origins", "https://a.example", "http://localhost:3000",
         "--max-connections", "7", "--header-timeout", "2.5", "--api-key", "k"]
    )  # fmt: skip
    settings = settings_from_args(args)
    assert settings.allowed_origins == ("https://a.example", "http://localhost:3000")
    assert (settings.max_connections, settings.header_timeout, settings.api_key) == (7, 2.5, "k")
    flags = {a.dest for a in parser._actions}
    assert {f.name for f in dataclasses.fields(GatewaySettings)} <= flags


def test_canonical_origin() -> None:
    assert canonical_origin("HTTPS://App.Example") == "https://app.example:443"
    assert canonical_origin("http://localhost:3000/") == "http://localhost:3000"
    for bad in ("null", "file://", "https://a.example/x", "https://a.example?q", "ftp://a"):
        assert canonical_origin(bad) is None, bad


def test_vllm_flags_for_the_model_names_and_token_ids() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(
        ["--served-model-name", "gpt-x", "alias", "--return-tokens-as-token-ids"]
    )
    settings = settings_from_args(args)
    assert settings.served_model_name == ("gpt-x", "alias")
    assert settings.return_tokens_as_token_ids is True
    assert GatewaySettings(served_model_name=["a"]).served_model_name == ("a",)  # from JSON
