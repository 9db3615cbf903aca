"""ServedModels: which adapter a request's `model` selects, the 404 for what is not served, and
GET /v1/models' cards in vLLM's shape."""

from __future__ import annotations

import pytest
from troupe.gateway.errors import ApiError
from troupe.gateway.served_models import ServedModels

ADAPTERS = {"sql": "/adapters/sql", "chat-v2": "/adapters/chat"}


def _not_found(served: ServedModels, model: str) -> ApiError:
    with pytest.raises(ApiError) as info:
        served.lora_for(model)
    error = info.value
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")
    return error


def test_model_selects_the_base_model_or_an_adapter() -> None:
    served = ServedModels("base", ADAPTERS)
    assert served.lora_for(None) is None and served.lora_for("") is None
    assert served.lora_for("base") is None
    assert served.lora_for("sql") == "sql" and served.lora_for("chat-v2") == "chat-v2"
    assert served.name_of(None) == "base" and served.name_of("sql") == "sql"


def test_an_unknown_model_is_a_404_listing_what_is_served() -> None:
    error = _not_found(ServedModels("base", ADAPTERS), "SQL")  # names are case-sensitive
    assert error.message == (
        "model 'SQL' does not exist; this server serves the model and its LoRA adapters: "
        "'base', 'sql', 'chat-v2'"
    )
    plain = _not_found(ServedModels("base"), "gpt-9")
    assert plain.message == "model 'gpt-9' does not exist; this server serves the model: 'base'"
    # an adapter's folder is not its name
    _not_found(ServedModels("base", ADAPTERS), "/adapters/sql")


def test_cards_list_the_base_model_then_each_adapter_under_it() -> None:
    cards = ServedModels("base", ADAPTERS).cards(2048)
    assert [(c["id"], c["root"], c["parent"]) for c in cards] == [
        ("base", "base", None),
        ("sql", "/adapters/sql", "base"),
        ("chat-v2", "/adapters/chat", "base"),
    ]
    assert all(c["object"] == "model" and c["max_model_len"] == 2048 for c in cards)
    assert [c["id"] for c in ServedModels("base").cards(1)] == ["base"]


def test_the_base_model_wins_over_an_adapter_of_its_name() -> None:
    served = ServedModels("base", {"base": "/adapters/shadowed", "sql": "/adapters/sql"})
    assert served.lora_for("base") is None
    assert [c["id"] for c in served.cards(16)] == ["base", "sql"]


NAMES = ("gpt-x", "alias")  # --served-model-name gpt-x alias


def test_served_names_replace_the_engines_id_and_the_first_is_the_public_one() -> None:
    served = ServedModels("engine-id", ADAPTERS, NAMES)
    assert [served.lora_for(m) for m in ("gpt-x", "alias", "", None)] == [None] * 4
    assert served.lora_for("sql") == "sql"
    assert served.model_id == "gpt-x"
    assert served.name_of(None) == "gpt-x" and served.name_of("sql") == "sql"
    error = _not_found(served, "engine-id")  # as vLLM: the model's own id is no longer served
    assert error.message == (
        "model 'engine-id' does not exist; this server serves the model and its LoRA adapters: "
        "'gpt-x', 'alias', 'sql', 'chat-v2'"
    )
    assert ServedModels("engine-id").model_id == "engine-id"  # without the flag: as before


def test_cards_list_each_served_name_then_the_adapters_under_the_first() -> None:
    cards = ServedModels("engine-id", ADAPTERS, NAMES).cards(64)
    assert [(c["id"], c["root"], c["parent"]) for c in cards] == [
        ("gpt-x", "engine-id", None),
        ("alias", "engine-id", None),
        ("sql", "/adapters/sql", "gpt-x"),
        ("chat-v2", "/adapters/chat", "gpt-x"),
    ]
    assert all(c["max_model_len"] == 64 for c in cards)


def test_every_served_name_wins_over_an_adapter_of_its_name() -> None:
    adapters = {"alias": "/adapters/shadowed", "sql": "/adapters/sql"}
    served = ServedModels("engine-id", adapters, NAMES)
    assert served.lora_for("alias") is None  # the base model, not the adapter
    assert [c["id"] for c in served.cards(16)] == ["gpt-x", "alias", "sql"]
    assert _not_found(served, "x").message.endswith(": 'gpt-x', 'alias', 'sql'")  # once
