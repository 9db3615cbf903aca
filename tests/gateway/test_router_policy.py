"""The router's pure parts: the prefix tree, the routing key, the policy's decisions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from troupe.config import ConfigError
from troupe.gateway.prefix_tree import PrefixTree
from troupe.gateway.router_app import PROXIED
from troupe.gateway.router_keys import (
    field_text,
    generate_text,
    invocations_text,
    messages_text,
    responses_text,
    routing_key,
)
from troupe.gateway.router_launch import replica_args
from troupe.gateway.router_policy import CacheAwarePolicy, RouteReason
from troupe.gateway.router_settings import RouterSettings


def _common(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_tree_matches_and_splits() -> None:
    tree = PrefixTree(1000)
    tree.insert("hello world")
    tree.insert("hello there")
    assert tree.match("hello world") == 11
    assert tree.match("hello thorn") == 8
    assert tree.match("help") == 3
    assert tree.match("xyz") == 0 and tree.match("") == 0
    assert tree.num_chars == len("hello ") + len("world") + len("there")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(alphabet="abc", max_size=12), max_size=12),
    st.lists(st.text(alphabet="abc", max_size=12), max_size=6),
)
def test_tree_match_is_the_longest_common_prefix(inserted: list[str], queries: list[str]) -> None:
    tree = PrefixTree(10_000)  # no eviction: the tree holds exactly what was inserted
    for key in inserted:
        tree.insert(key)
    for q in queries + inserted:
        assert tree.match(q) == max((_common(q, k) for k in inserted), default=0)
    distinct_chars = len({k[:i] for k in inserted for i in range(1, len(k) + 1)})
    assert tree.num_chars == distinct_chars  # one character per distinct non-empty prefix


def test_tree_evicts_least_recently_used_within_its_bound() -> None:
    tree = PrefixTree(100)
    tree.insert("a" * 40)
    tree.insert("b" * 40)
    tree.insert("a" * 40)  # a is now the more recent
    tree.insert("c" * 40)  # 120 > 100: cut down to 90, the LRU (b) first
    assert tree.num_chars <= 100
    assert tree.match("b" * 40) == 0
    assert tree.match("a" * 40) == 40 and tree.match("c" * 40) == 40


CHAT, PROMPT = messages_text, field_text("prompt")


def test_routing_key_shares_prefixes_as_conversations_do() -> None:
    system = {"role": "system", "content": "You are terse."}
    a = routing_key({"messages": [system, {"role": "user", "content": "hi"}]}, CHAT)
    b = routing_key({"messages": [system, {"role": "user", "content": "bye"}]}, CHAT)
    assert a != b and _common(a, b) >= len("system") + len("You are terse.")
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert routing_key(parts, CHAT) == routing_key(
        {"messages": [{"role": "user", "content": "hi"}]}, CHAT
    )
    assert routing_key({"prompt": "abc"}, PROMPT) == "abc"
    ids = routing_key({"prompt": [1, 2, 3]}, PROMPT)
    assert ids.endswith("\x01\x02\x03") and not ids.startswith("\x01")
    assert routing_key({"prompt": ["abc"]}, PROMPT) == "abc"
    assert routing_key(None, PROMPT) == "" and routing_key([1], CHAT) == ""


def test_a_responses_conversation_keys_as_the_same_chat_does() -> None:
    system = "You answer questions about tariffs in one sentence."
    chat = routing_key(
        {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]},
        CHAT,
    )
    assert routing_key({"instructions": system, "input": "Hi"}, responses_text) == chat
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "price", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "3 EUR"},
    ]
    turn = routing_key({"instructions": system, "input": items}, responses_text)
    assert turn.startswith(chat) and len(turn) > len(chat)  # the tool round trip follows
    later = routing_key({"instructions": system, "input": [*items, {"role": "user",
                         "content": "And to zone 2?"}]}, responses_text)  # fmt: skip
    assert later.startswith(turn)
    salted = routing_key({"input": "Hi", "cache_salt": "t1"}, responses_text)
    assert salted[1:] == routing_key({"input": "Hi"}, responses_text) != salted


def test_score_and_rerank_key_on_their_query() -> None:
    query = "Which parcels ship to zone 3?"
    docs = ["Zone 3 is Europe.", "Parcels over 30 kg ship as freight."]
    rerank = routing_key({"query": query, "documents": docs}, field_text("query"))
    score = routing_key({"text_1": query, "text_2": docs}, field_text("text_1"))
    assert rerank == score == routing_key({"prompt": query}, PROMPT) == query
    assert routing_key({"text_1": [query], "text_2": docs}, field_text("text_1")) == query


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"messages": [{"role": "user", "content": "Hi"}], "model": "m"}, "/v1/chat/completions"),
        ({"prompt": [5, 6], "cache_salt": "s"}, "/v1/completions"),
        ({"input": "shared prefix"}, "/v1/embeddings"),
        ({"text_1": "q", "text_2": ["a"]}, "/v1/score"),
        ({"query": "q", "documents": ["a"]}, "/v1/rerank"),
    ],
)
def test_invocations_key_as_the_endpoint_they_name(body: dict[str, object], path: str) -> None:
    assert routing_key(body, invocations_text) == routing_key(body, PROXIED[path].text) != ""
    assert invocations_text({"model": "m", "text_1": "q"}) == ""  # names no endpoint


def test_sglang_generate_keys_as_a_completion_does() -> None:
    for prompt, field in (("shared prefix", "text"), ([5, 6], "input_ids")):
        assert routing_key({field: prompt}, generate_text) == routing_key(
            {"prompt": prompt}, PROMPT
        )


def _policy(**kw: object) -> CacheAwarePolicy:
    urls = ("http://a:1", "http://b:1", "http://c:1")
    return CacheAwarePolicy(3, RouterSettings(backend_urls=urls).replace(**kw))


def test_policy_follows_prefix_spreads_the_rest_and_balances_load() -> None:
    policy = _policy(balance_abs_threshold=4, balance_rel_threshold=1.5)
    up = [True, True, True]
    system = "S" * 100
    first = policy.choose(system + "q1", [0, 0, 0], up)
    assert first is not None and first.reason is RouteReason.SPREAD and first.replica == 0
    second = policy.choose(system + "q2", [1, 0, 0], up)  # loads within the thresholds
    assert second is not None and second.replica == 0 and second.reason is RouteReason.PREFIX
    assert second.matched_chars == 101
    other = policy.choose("T" * 100, [2, 0, 0], up)  # unrelated: least loaded, least remembered
    assert other is not None and other.replica == 1 and other.reason is RouteReason.SPREAD
    third = policy.choose("U" * 100, [2, 1, 0], up)
    assert third is not None and third.replica == 2
    busy = policy.choose(system + "q3", [9, 1, 0], up)  # 9 - 0 > 4 and 9 > 1.5 * 0
    assert busy is not None and busy.replica == 2 and busy.reason is RouteReason.LOAD
    # The prefix now lives on 0 and 2: a later request follows either, the less loaded.
    again = policy.choose(system + "q4", [3, 3, 2], up)
    assert again is not None and again.replica == 2 and again.reason is RouteReason.PREFIX


def test_policy_skips_replicas_that_are_down() -> None:
    policy = _policy()
    assert policy.choose("x", [0, 0, 0], [False, False, False]) is None
    system = "S" * 50
    assert policy.choose(system + "1", [0, 0, 0], [True, True, True]).replica == 0  # type: ignore[union-attr]
    route = policy.choose(system + "2", [0, 0, 0], [False, True, True])
    assert route is not None and route.replica == 1 and route.reason is RouteReason.SPREAD


def test_settings_name_the_bad_field() -> None:
    with pytest.raises(ConfigError, match="backend_urls"):
        RouterSettings(backend_urls=("localhost:8000",))
    with pytest.raises(ConfigError, match="cache_threshold"):
        RouterSettings(cache_threshold=1.5)
    with pytest.raises(ConfigError, match="balance_rel_threshold"):
        RouterSettings(balance_rel_threshold=0.5)
    with pytest.raises(ConfigError, match="twice"):
        RouterSettings(backend_urls=("http://a:1", "http://a:1/"))


def test_replica_args_drop_where_to_listen_and_the_dp_size() -> None:
    argv = ["serve", "--port", "9000", "--host=0.0.0.0", "--data-parallel-size", "2",
            "--runner", "fake", "--log-format", "console", "--api-key", "k"]  # fmt: skip
    assert replica_args(argv) == ["serve", "--runner", "fake", "--api-key", "k"]


def test_router_command_line_builds_its_settings(capsys: pytest.CaptureFixture[str]) -> None:
    from troupe.gateway.router_launch import router_settings_from_args
    from troupe.ops.cli import build_parser, main

    argv = ["router", "--backend-urls", "http://a:1", "http://b:2/", "--cache-threshold", "0.7",
            "--api-key", "k"]  # fmt: skip
    ns = build_parser().parse_args(argv)
    settings = router_settings_from_args(ns, ns.backend_urls)
    assert settings.backend_urls == ("http://a:1", "http://b:2")
    assert settings.cache_threshold == 0.7 and settings.balance_abs_threshold == 16
    assert settings.api_key == "k"
    assert main(["router", "--backend-urls", "localhost:1"]) == 2
    assert "backend_urls: 'localhost:1'" in capsys.readouterr().err
    assert main(["serve", "--data-parallel-size", "0", "--runner", "fake"]) == 2
    assert "--data-parallel-size must be >= 1" in capsys.readouterr().err
