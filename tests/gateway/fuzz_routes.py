"""What the route fuzzers send (tests/gateway/test_fuzz_*.py): for each route, its fields' valid
values (some of them past the engine's limits: those are 400s too) from which `perturbed`
builds a body and then breaks up to two fields.

The server these are aimed at serves the fake runner's SmolLM2 vocabulary with max_model_len
128 and one LoRA adapter, `sql`; `model` is drawn from the served names and two that are not.
Schemas mix valid ones, ones xgrammar refuses and junk dicts; tools carry those schemas.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.gateway.fuzz_bodies import JUNK, TEXT, TOKEN_IDS, perturbed

MODEL = "SmolLM2-135M-Instruct"

GOOD_SCHEMAS = st.sampled_from(
    [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"type": "string", "maxLength": 3},
        {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
        {"enum": ["x", "y"]},
        {},
        True,
    ]
)
BAD_SCHEMAS = st.sampled_from(
    [
        {"type": "frob"},
        {"type": 5},
        {"type": "object", "properties": {"a": {"type": "wat"}}},
        {"$ref": "#/definitions/nope"},
        {"type": "string", "pattern": "("},
        {"type": "string", "minLength": -1},
        {"type": "string", "minLength": 5, "maxLength": 2},
        {"enum": []},
        {"type": "array", "minItems": 5, "maxItems": 2},
        {"type": "integer", "minimum": 10, "maximum": 1},
        {"type": "integer", "minimum": 1e400},
        {"properties": []},
        {"required": "a"},
        {"allOf": 3},
        {"anyOf": []},
        {"type": ["string", 3]},
        {"type": "string", "format": "nonsense"},
        {"type": "array", "prefixItems": {"a": 1}},
        {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        False,
        "not a schema",
        {"type": "object", "additionalProperties": 7},
        {"const": float("nan")},
    ]
)
LITERAL_SCHEMAS = st.builds(lambda t: {"const": t}, TEXT) | st.builds(
    lambda ts: {"enum": ts}, st.lists(TEXT, min_size=1, max_size=2)
)  # text the model must write as given: control and astral characters included
SCHEMAS = (
    GOOD_SCHEMAS
    | BAD_SCHEMAS
    | LITERAL_SCHEMAS
    | st.dictionaries(st.text(max_size=8), JUNK, max_size=3)
)
REGEXES = st.sampled_from(
    ["[a-z]+", "(", "a{5,2}", "\\", "[z-a]", "(?P<x>a)", "a**", ".*", "", "\\p{Lu}", "(?=a)b"]
) | st.text(max_size=6)
GRAMMARS = st.sampled_from(
    ['root ::= "a"', "root ::= ", "root ::= b", "x", 'root ::= "a"*', ""]
) | st.text(max_size=8)
STRUCTURED = {
    "response_format": st.one_of(
        st.just({"type": "text"}),
        st.just({"type": "json_object"}),
        st.builds(
            lambda s, n: {"type": "json_schema", "json_schema": {"name": n, "schema": s}},
            SCHEMAS,
            TEXT,
        ),
        st.builds(lambda t: {"type": t}, TEXT),
        st.just({"type": "json_schema"}),
        st.just({"type": "json_schema", "json_schema": {}}),
    ),
    "guided_json": SCHEMAS | st.text(max_size=10) | st.just('{"type": "object"}'),
    "guided_regex": REGEXES,
    "guided_choice": st.lists(TEXT, max_size=3),
    "guided_grammar": GRAMMARS,
    "structured_outputs": st.fixed_dictionaries(
        {},
        optional={
            "json": SCHEMAS,
            "regex": REGEXES,
            "choice": st.lists(TEXT, max_size=3),
            "grammar": GRAMMARS,
            "json_object": st.booleans(),
        },
    ),
}
SAMPLING: dict[str, st.SearchStrategy[Any]] = {
    "max_tokens": st.integers(0, 6) | st.sampled_from([127, 128, 129, 10**6, 2**63]),
    "temperature": st.sampled_from([0.0, 0.7, 1.0, 2.0]),
    "top_p": st.floats(0.0, 1.0),
    "top_k": st.integers(-1, 50),
    "min_p": st.floats(0.0, 1.0),
    "seed": st.integers(-1, 2**64),
    "stop": TEXT | st.lists(TEXT, max_size=40),
    "stop_token_ids": st.lists(st.integers(-1, 2**40), max_size=5),
    "ignore_eos": st.booleans(),
    "presence_penalty": st.floats(-2.0, 2.0),
    "frequency_penalty": st.floats(-2.0, 2.0),
    "repetition_penalty": st.floats(0.0, 2.0),
    "priority": st.integers(-(2**63), 2**63),
    "skip_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "min_tokens": st.integers(0, 200),
    "n": st.integers(0, 20),
    "logit_bias": st.dictionaries(
        st.integers(-5, 2**40).map(str) | TEXT, st.floats(-200, 200), max_size=3
    ),
    "allowed_token_ids": st.lists(st.integers(-1, 2**40), max_size=4),
    "bad_words": st.lists(TEXT, max_size=3),
    "truncate_prompt_tokens": st.integers(-2, 300),
    "add_special_tokens": st.booleans(),
    "prompt_logprobs": st.integers(-1, 30),
    "streaming_window": st.integers(-1, 200),
    "sink_tokens": st.integers(-1, 200),
    "cache_salt": TEXT,
    "return_tokens_as_token_ids": st.booleans(),
    "return_token_ids": st.booleans(),
    "request_id": TEXT,
    "use_beam_search": st.booleans(),
    "length_penalty": st.floats(allow_nan=True),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries(
        {}, optional={"include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}
    ),
    "model": st.sampled_from([MODEL, "sql", "nope", ""]),
    "user": TEXT,
    **STRUCTURED,
}
COMPLETION = perturbed(
    {
        **SAMPLING,
        "prompt": TEXT
        | TOKEN_IDS
        | st.lists(TEXT | TOKEN_IDS | st.integers(-3, 2**40), min_size=0, max_size=3),
        "prompt_embeds": st.text(max_size=12)
        | st.just("AAAA")
        | st.lists(st.text(max_size=8), max_size=2),
        "logprobs": st.integers(-1, 30),
        "echo": st.booleans(),
        "best_of": st.integers(0, 20),
        "suffix": TEXT,
    },
    required=("prompt",),
    extra=("messages",),
    huge=True,
)


def _tool(draw_name: Any, params: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": draw_name, "parameters": params}}


TOOLS = st.lists(
    st.builds(_tool, st.sampled_from(["get", "f", ""]) | TEXT, SCHEMAS | st.none()), max_size=3
)
TOOL_CHOICE = (
    st.sampled_from(["none", "auto", "required", "frob"])
    | st.builds(
        lambda n: {"type": "function", "function": {"name": n}}, st.sampled_from(["get", "zz"])
    )
    | JUNK
)
MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "developer"]), "content": TEXT}
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("user"),
            "content": st.lists(
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["text", "image_url", "input_audio"]), "text": TEXT}
                ),
                max_size=2,
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": st.none(),
            "tool_calls": st.just(
                [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}]
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": TEXT,
                        "type": st.just("function"),
                        "function": st.fixed_dictionaries({"name": TEXT, "arguments": TEXT}),
                    }
                ),
                max_size=2,
            ),
        }
    ),
    st.fixed_dictionaries(
        {"role": st.just("tool"), "content": TEXT}, optional={"tool_call_id": TEXT}
    ),
    perturbed(
        {
            "role": st.sampled_from(["user", "tool", "wizard"]),
            "content": TEXT,
            "name": TEXT,
            "tool_call_id": TEXT,
            "reasoning_content": TEXT,
        },
        ("role", "content"),
    ),
)
CHAT = perturbed(
    {
        **SAMPLING,
        "messages": st.lists(MESSAGE, min_size=0, max_size=4),
        "max_completion_tokens": st.integers(-1, 200),
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(-1, 30),
        "tools": TOOLS,
        "tool_choice": TOOL_CHOICE,
        "parallel_tool_calls": st.booleans(),
        "store": st.booleans(),
        "metadata": st.dictionaries(TEXT, TEXT, max_size=2),
        "add_generation_prompt": st.booleans(),
        "continue_final_message": st.booleans(),
        "chat_template_kwargs": st.dictionaries(
            st.sampled_from(["enable_thinking", "tools", "messages", "x"]), JUNK, max_size=2
        ),
        "echo": st.booleans(),
        "documents": st.lists(st.dictionaries(TEXT, TEXT, max_size=2), max_size=2),
        "reasoning_effort": st.sampled_from(["low", "medium", "high", "extreme"]),
    },
    required=("messages",),
    extra=("prompt", "best_of", "suffix"),
    huge=True,
)

ITEM = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "developer", "assistant"]), "content": TEXT}
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("message"),
            "role": st.just("user"),
            "content": st.lists(
                st.fixed_dictionaries(
                    {
                        "type": st.sampled_from(["input_text", "output_text", "input_image", "x"]),
                        "text": TEXT,
                    }
                ),
                max_size=2,
            ),
        }
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call"), "call_id": TEXT, "name": TEXT, "arguments": TEXT}
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": TEXT, "output": TEXT}
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("reasoning"),
            "summary": st.lists(
                st.fixed_dictionaries({"type": st.just("summary_text"), "text": TEXT}), max_size=1
            ),
        }
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["item_reference", "web_search_call", "frob"]), "id": TEXT}
    ),
    JUNK.filter(lambda j: isinstance(j, dict)),
)
RESPONSES = perturbed(
    {
        "model": SAMPLING["model"],
        "input": TEXT | st.lists(ITEM, max_size=3),
        "instructions": TEXT,
        "max_output_tokens": st.integers(-1, 300) | st.just(2**64),
        "temperature": SAMPLING["temperature"],
        "top_p": SAMPLING["top_p"],
        "stream": st.booleans(),
        "text": st.fixed_dictionaries(
            {},
            optional={
                "format": st.one_of(
                    st.just({"type": "text"}),
                    st.just({"type": "json_object"}),
                    st.builds(lambda s: {"type": "json_schema", "name": "x", "schema": s}, SCHEMAS),
                    st.just({"type": "json_schema"}),
                )
            },
        ),
        "tools": st.lists(
            st.one_of(
                st.builds(
                    lambda n, p: {"type": "function", "name": n, "parameters": p},
                    st.sampled_from(["get", ""]) | TEXT,
                    SCHEMAS | st.none(),
                ),
                st.just({"type": "web_search"}),
                JUNK,
            ),
            max_size=2,
        ),
        "tool_choice": TOOL_CHOICE | st.just({"type": "function", "name": "get"}),
        "reasoning": st.fixed_dictionaries(
            {}, optional={"effort": st.sampled_from(["low", "high", "x"])}
        ),
        "metadata": st.dictionaries(TEXT, TEXT, max_size=2)
        | st.dictionaries(st.text(max_size=70), st.text(max_size=600), max_size=17),
        "truncation": st.sampled_from(["auto", "disabled", "x"]),
        "include": st.lists(
            st.sampled_from(["message.output_text.logprobs", "reasoning.encrypted_content", "x"]),
            max_size=2,
        ),
        "top_logprobs": st.integers(-1, 30),
        "store": st.booleans(),
        "previous_response_id": st.sampled_from(["resp_nope", "", "x"]) | TEXT,
        "conversation": TEXT | JUNK,
        "background": st.booleans(),
        "max_tool_calls": st.integers(-1, 5),
        "prompt": JUNK,
        "top_k": SAMPLING["top_k"],
        "min_p": SAMPLING["min_p"],
        "seed": SAMPLING["seed"],
        "stop": SAMPLING["stop"],
        "min_tokens": SAMPLING["min_tokens"],
        "priority": SAMPLING["priority"],
        "repetition_penalty": SAMPLING["repetition_penalty"],
        "cache_salt": TEXT,
        "parallel_tool_calls": st.booleans(),
        "service_tier": TEXT,
    },
    required=("input",),
    extra=("messages", "n"),
    huge=True,
)

ROUTES = {
    "/v1/completions": COMPLETION,
    "/v1/chat/completions": CHAT,
    "/v1/responses": RESPONSES,
}
