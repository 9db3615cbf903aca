"""What the route fuzzers send to the routes that answer one JSON body without generating
text: pooling (/v1/embeddings, /pooling, /classify, /v1/score, /v1/rerank), /tokenize and
/detokenize, and the admin routes (LoRA load/unload, /update_weights_from_disk,
/reset_prefix_cache). As in fuzz_routes.py: valid values, some past the engine's limits.
"""

from __future__ import annotations

from hypothesis import strategies as st

from tests.gateway.fuzz_bodies import JUNK, TEXT, TOKEN_IDS, perturbed
from tests.gateway.fuzz_routes import CHAT, MESSAGE, MODEL, SAMPLING, TOOLS

INPUT = (
    TEXT
    | TOKEN_IDS
    | st.lists(TEXT | TOKEN_IDS | st.integers(-3, 2**40) | st.just([]), min_size=0, max_size=3)
)
POOL_COMMON = {
    "model": SAMPLING["model"],
    "user": TEXT,
    "priority": SAMPLING["priority"],
    "truncate_prompt_tokens": st.integers(-2, 300) | st.just(2**63),
}
EMBEDDINGS = perturbed(
    {
        **POOL_COMMON,
        "input": INPUT,
        "encoding_format": st.sampled_from(["float", "base64", "bf16", "x"]),
        "dimensions": st.integers(-1, 2000),
        "normalize": st.booleans(),
        "use_activation": st.booleans(),
    },
    required=("input",),
    huge=True,
)
ENCODE = perturbed(  # SGLang's /encode
    {
        "text": INPUT,
        "input_ids": INPUT,
        "rid": TEXT | st.lists(TEXT, max_size=3),
        "lora_path": st.sampled_from(["sql", "nope", ""]),
        "normalize": st.booleans(),
    },
    required=("text",),
    huge=True,
)
POOLING = perturbed(
    {
        **POOL_COMMON,
        "input": INPUT,
        "task": st.sampled_from(
            ["embed", "classify", "token_embed", "token_classify", "score", "encode", "x"]
        ),
        "encoding_format": st.sampled_from(["float", "base64", "x"]),
        "dimensions": st.integers(-1, 2000),
        "use_activation": st.booleans(),
        "normalize": st.booleans(),
        "activation": st.booleans(),
        "softmax": st.booleans(),
    },
    required=("input",),
    huge=True,
)
CLASSIFY = perturbed(
    {
        **POOL_COMMON,
        "input": INPUT,
        "use_activation": st.booleans(),
        "activation": st.booleans(),
        "softmax": st.booleans(),
    },
    required=("input",),
    huge=True,
)
TEXTS = TEXT | st.lists(TEXT, min_size=0, max_size=3)
SCORE = perturbed(
    {
        **POOL_COMMON,
        "text_1": TEXTS,
        "text_2": TEXTS,
        "encoding_format": st.sampled_from(["float", "base64", "x"]),
    },
    required=("text_1", "text_2"),
    extra=("queries", "documents", "data_1"),
    huge=True,
)
RERANK = perturbed(
    {
        **POOL_COMMON,
        "query": TEXT,
        "documents": st.lists(TEXT | st.fixed_dictionaries({"text": TEXT}), max_size=3),
        "top_n": st.integers(-2, 10) | st.just(2**63),
        "return_documents": st.booleans(),
    },
    required=("query", "documents"),
    huge=True,
)
TOKENIZE = perturbed(
    {
        "model": SAMPLING["model"],
        "prompt": TEXT,
        "messages": st.lists(MESSAGE, max_size=3),
        "add_special_tokens": st.booleans(),
        "add_generation_prompt": st.booleans(),
        "continue_final_message": st.booleans(),
        "return_token_strs": st.booleans(),
        "chat_template_kwargs": CHAT.map(lambda b: b.get("chat_template_kwargs", {})),
        "tools": TOOLS,
    },
    required=(),
    extra=(),
    huge=True,
)
DETOKENIZE = perturbed(
    {
        "model": SAMPLING["model"],
        "tokens": st.lists(
            st.integers(-5, 2**64) | st.sampled_from([49151, 49152, 0, 1, 2]), max_size=6
        ),
    },
    required=("tokens",),
    huge=True,
)
LORA_LOAD = perturbed(
    {
        "lora_name": st.sampled_from(["x", "", "sql", MODEL]) | TEXT,
        "lora_path": st.sampled_from(["/adapters/x", "", "/nonexistent", "relative"]) | TEXT,
        "load_inplace": st.booleans(),
    },
    required=("lora_name", "lora_path"),
)
LORA_UNLOAD = perturbed(
    {"lora_name": st.sampled_from(["x", "", "sql", MODEL]) | TEXT, "lora_int_id": st.integers()},
    required=("lora_name",),
)
UPDATE = perturbed(
    {
        "model_path": st.sampled_from(["", "/nonexistent", "/tmp", "."]) | TEXT,
        "load_format": st.sampled_from(["auto", "x", ""]),
        "abort_all_requests": st.booleans(),
        "flush_cache": st.booleans(),
    },
    required=("model_path",),
)
RESET = perturbed({"x": JUNK}, required=())


POOLING_ROUTES = {
    "/v1/embeddings": EMBEDDINGS,
    "/encode": ENCODE,
    "/pooling": POOLING,
    "/classify": CLASSIFY,
    "/v1/score": SCORE,
    "/v1/rerank": RERANK,
    "/rerank": RERANK,
    "/tokenize": TOKENIZE,
    "/detokenize": DETOKENIZE,
}
ADMIN_ROUTES = {
    "/v1/load_lora_adapter": LORA_LOAD,
    "/v1/unload_lora_adapter": LORA_UNLOAD,
    "/update_weights_from_disk": UPDATE,
    "/reset_prefix_cache": RESET,
}
