"""What the route fuzzers send to SGLang's /generate: its body's fields and its sampling keys
(and one SGLang has that troupe refuses, stop_regex). As in fuzz_routes.py: valid values, some
past the engine's limits."""

from __future__ import annotations

from hypothesis import strategies as st

from tests.gateway.fuzz_bodies import TEXT, TOKEN_IDS, perturbed
from tests.gateway.fuzz_routes import SAMPLING

SGLANG_SAMPLING = st.fixed_dictionaries(
    {},
    optional={
        "max_new_tokens": st.integers(-1, 6) | st.sampled_from([0, 127, 128, 10**6, 2**63]),
        "min_new_tokens": st.integers(-1, 200),
        "no_stop_trim": st.booleans(),
        "sampling_seed": SAMPLING["seed"],
        "json_schema": st.sampled_from(['{"type": "object"}', "{", '"x"']),
        "regex": st.sampled_from(["a+", "(", "[0-9]{2}"]),
        "ebnf": st.sampled_from(['root ::= "a"', "root ::="]),
        "stop_regex": TEXT,
        **{
            k: SAMPLING[k]
            for k in (
                "temperature",
                "top_p",
                "top_k",
                "min_p",
                "stop",
                "stop_token_ids",
                "ignore_eos",
                "skip_special_tokens",
                "presence_penalty",
                "frequency_penalty",
                "repetition_penalty",
                "logit_bias",
            )
        },
        "n": st.integers(0, 4),
    },
)
GENERATE = perturbed(
    {
        "text": TEXT | st.lists(TEXT, max_size=3),
        "input_ids": TOKEN_IDS | st.lists(TOKEN_IDS | st.integers(-3, 2**40), max_size=3),
        "sampling_params": SGLANG_SAMPLING | st.lists(SGLANG_SAMPLING, max_size=3),
        "stream": st.booleans(),
        "rid": TEXT | st.lists(TEXT, max_size=3),
        "return_logprob": st.booleans(),
        "logprob_start_len": st.integers(-2, 10),
        "top_logprobs_num": st.integers(-1, 30),
        "return_text_in_logprobs": st.booleans(),
        "lora_path": st.sampled_from(["sql", "nope", ""]),
    },
    required=("text",),
    huge=True,
)
