"""What the route fuzzers send to Anthropic's /v1/messages and its count_tokens: the body's
fields, content blocks of every type (the served ones and image, document and junk), tools
with the schemas of fuzz_routes.py (and a hosted tool), tool_choice, thinking and
output_config. As in fuzz_routes.py: valid values, some past the engine's limits (junk comes
from `perturbed` and from the blocks); errors are
Anthropic's object, so a 400 names its field in its message."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.gateway.fuzz_bodies import JUNK, TEXT, perturbed
from tests.gateway.fuzz_routes import MODEL, SAMPLING, SCHEMAS

_NAMES = st.sampled_from(["get", "f", ""]) | TEXT
BLOCK = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, TEXT),
    st.builds(lambda i, n: {"type": "tool_use", "id": i, "name": n, "input": {}}, TEXT, _NAMES),
    st.builds(
        lambda i, c: {"type": "tool_result", "tool_use_id": i, "content": c},
        TEXT,
        TEXT | st.lists(st.builds(lambda t: {"type": "text", "text": t}, TEXT), max_size=2) | JUNK,
    ),
    st.builds(lambda t: {"type": "thinking", "thinking": t, "signature": ""}, TEXT),
    st.just({"type": "redacted_thinking", "data": "x"}),
    st.just({"type": "image", "source": {"type": "base64", "data": "AAAA"}}),
    st.builds(lambda t: {"type": t}, TEXT),
    JUNK,
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "user", "assistant", "system"]),
        "content": TEXT | st.lists(BLOCK, max_size=3),
    }
)
ASKED = st.builds(lambda t: {"role": "user", "content": t}, TEXT)  # a turn that runs
CONVERSATION = st.builds(lambda first, rest: [first, *rest], ASKED, st.lists(MESSAGE, max_size=2))
TOOL = st.one_of(
    st.builds(lambda n, s: {"name": n, "input_schema": s}, _NAMES, SCHEMAS),
    st.builds(lambda n: {"type": "web_search_20250305", "name": n}, _NAMES),
    JUNK,
)
MESSAGES_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from([MODEL, "sql", "nope", ""]),
    "messages": st.one_of(
        st.lists(ASKED, min_size=1, max_size=2),
        st.lists(ASKED, min_size=1, max_size=2),
        CONVERSATION,
        st.lists(MESSAGE, max_size=3),
    ),
    "system": TEXT | st.lists(st.builds(lambda t: {"type": "text", "text": t}, TEXT), max_size=2),
    "tools": st.lists(TOOL, max_size=2),
    "tool_choice": st.builds(
        lambda t, n: {"type": t, "name": n},
        st.sampled_from(["auto", "any", "tool", "none", "frob"]),
        _NAMES,
    ),
    "thinking": st.sampled_from(
        [{"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}, {"type": "adaptive"}]
    ),
    "output_config": st.builds(
        lambda s, e: {"format": {"type": "json_schema", "schema": s}, "effort": e},
        SCHEMAS,
        st.sampled_from(["low", "high"]),
    ),
    "chat_template_kwargs": st.dictionaries(
        st.sampled_from(["x", "enable_thinking"]), st.booleans() | TEXT
    ),
}
MESSAGES = perturbed(
    {
        **MESSAGES_FIELDS,
        "max_tokens": st.integers(1, 6) | SAMPLING["max_tokens"] | st.just(-1),
        "stop_sequences": st.lists(TEXT, max_size=3),
        "stream": st.booleans(),
        "temperature": SAMPLING["temperature"],
        "top_p": SAMPLING["top_p"],
        "top_k": SAMPLING["top_k"],
        "metadata": st.builds(lambda u: {"user_id": u}, TEXT),
        "container": TEXT,
        "mcp_servers": st.lists(JUNK, max_size=1),
    },
    required=("model", "messages", "max_tokens"),
    extra=("prompt", "n"),
    huge=True,
)
COUNT_TOKENS = perturbed(MESSAGES_FIELDS, required=("model", "messages"), huge=True)


def check_anthropic_error(status: int, answer: Any) -> None:
    """A 4xx in Anthropic's shape, with a message."""
    assert status < 500, (status, answer)
    assert isinstance(answer, dict) and set(answer) == {"type", "error"}, answer
    assert answer["type"] == "error" and set(answer["error"]) == {"type", "message"}, answer
    assert isinstance(answer["error"]["message"], str) and answer["error"]["message"], answer
