"""TokenizerCore with the real SmolLM2 tokenizer: exact ids, exact messages, exact order."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import Tokenizer, processors
from troupe.actors.core.tokenizer import TokenizerCore
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.messages import (
    AbortRequest,
    ChatMessage,
    GenerateRequest,
    RejectCode,
    RequestOpened,
    RequestRejected,
    SamplingParams,
    TokenizedRequest,
)

PARAMS = SamplingParams(max_tokens=5, temperature=0.0)


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


@pytest.fixture
def core(tok: TextTokenizer) -> TokenizerCore:
    return TokenizerCore(tok)


def _req(request_id: str, **kwargs: Any) -> GenerateRequest:
    return GenerateRequest(request_id=request_id, params=PARAMS, arrival_time=10.5, **kwargs)


def test_prompt_opens_then_admits(core: TokenizerCore) -> None:
    out = core.handle([_req("r1", prompt="Hello world")])
    assert out == [
        (
            "streamer",
            RequestOpened(
                request_id="r1",
                params=PARAMS,
                num_prompt_tokens=2,
                prompt_tail_ids=(19556, 905),
                arrival_time=10.5,
            ),
        ),
        (
            "admission",
            TokenizedRequest(
                request_id="r1", prompt_token_ids=(19556, 905), params=PARAMS, arrival_time=10.5
            ),
        ),
    ]


def test_chat_is_rendered_and_not_given_special_tokens_twice(
    core: TokenizerCore, tok: TextTokenizer
) -> None:
    messages = (ChatMessage(role="user", content="Hi"),)
    out = core.handle([_req("c", messages=messages)])
    text = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tuple(tok.encode(text, add_special_tokens=False))
    assert ids[0] == 1 and ids[1] != 1  # <|im_start|> once, from the template
    assert ids[-4:] == (1, 520, 9531, 198)  # "<|im_start|>assistant\n"
    admitted = out[1][1]
    assert isinstance(admitted, TokenizedRequest) and admitted.prompt_token_ids == ids
    opened = out[0][1]
    assert isinstance(opened, RequestOpened)
    assert opened.num_prompt_tokens == len(ids) and opened.prompt_tail_ids == ids[-8:]
    no_gen = core.handle([_req("c2", messages=messages, add_generation_prompt=False)])
    admitted2 = no_gen[1][1]
    assert isinstance(admitted2, TokenizedRequest)
    assert admitted2.prompt_token_ids == ids[:-4]


def test_prompt_token_ids_pass_through_and_are_checked(core: TokenizerCore) -> None:
    out = core.handle([_req("t", prompt_token_ids=(0, 5, 49151))])
    admitted = out[1][1]
    assert isinstance(admitted, TokenizedRequest) and admitted.prompt_token_ids == (0, 5, 49151)
    (bad,) = core.handle([_req("t2", prompt_token_ids=(3, 49152))])
    assert bad == (
        "streamer",
        RequestRejected(
            request_id="t2",
            code=RejectCode.INVALID_REQUEST,
            message="prompt_token_ids[1] = 49152 is outside the vocabulary [0, 49152)",
            field="prompt_token_ids",
        ),
    )
    (neg,) = core.handle([_req("t3", prompt_token_ids=(-1,))])
    assert isinstance(neg[1], RequestRejected) and neg[1].field == "prompt_token_ids"


@pytest.mark.parametrize(
    ("kwargs", "field", "fragment"),
    [
        ({"prompt": ""}, "prompt", "prompt must not be empty"),
        (
            {},
            "prompt",
            "exactly one of prompt, messages, prompt_token_ids, prompt_embeds must be set (got none)",
        ),
        ({"prompt": "a", "prompt_token_ids": (1,)}, "prompt", "(got prompt, prompt_token_ids)"),
        ({"messages": ()}, "messages", "messages must not be empty"),
        ({"prompt_token_ids": ()}, "prompt_token_ids", "prompt_token_ids must not be empty"),
    ],
)
def test_bad_requests_are_rejected_naming_the_field(
    core: TokenizerCore, kwargs: dict[str, object], field: str, fragment: str
) -> None:
    (out,) = core.handle([_req("bad", **kwargs)])
    outbox, msg = out
    assert outbox == "streamer" and isinstance(msg, RequestRejected)
    assert msg.code == RejectCode.INVALID_REQUEST and msg.field == field
    assert fragment in msg.message


def test_chat_without_template_is_rejected(tok: TextTokenizer) -> None:
    no_template = load_tokenizer()
    no_template.chat_template = None
    (out,) = TokenizerCore(no_template).handle(
        [_req("x", messages=(ChatMessage(role="user", content="hi"),))]
    )
    assert isinstance(out[1], RequestRejected) and out[1].field == "messages"
    assert "has no chat template" in out[1].message


def test_batch_keeps_inbox_order_and_forwards_aborts(core: TokenizerCore) -> None:
    abort = AbortRequest(request_id="a", reason="gone")
    out = core.handle(
        [
            _req("a", prompt="one"),
            abort,
            _req("b", prompt=""),
            _req("c", messages=(ChatMessage(role="user", content="two"),)),
            _req("d", prompt="three"),
        ]
    )
    route = [(box, type(msg).__name__, getattr(msg, "request_id", None)) for box, msg in out]
    assert route == [
        ("streamer", "RequestOpened", "a"),
        ("admission", "TokenizedRequest", "a"),
        ("admission", "AbortRequest", "a"),
        ("streamer", "RequestRejected", "b"),
        ("streamer", "RequestOpened", "c"),
        ("admission", "TokenizedRequest", "c"),
        ("streamer", "RequestOpened", "d"),
        ("admission", "TokenizedRequest", "d"),
    ]
    assert out[2][1] is abort
    three = out[7][1]
    assert isinstance(three, TokenizedRequest) and three.prompt_token_ids == (16347,)


def test_vocab_size_override_is_the_limit(tok: TextTokenizer) -> None:
    (out,) = TokenizerCore(tok, vocab_size=100).handle([_req("v", prompt_token_ids=(100,))])
    assert isinstance(out[1], RequestRejected)
    assert out[1].message.endswith("[0, 100)")


# -- long inputs: rejected by a cheap bound, or encoded in chunks up to the limit ------------

PROSE = "The quick brown fox jumps over the lazy dog. "  # 10 tokens, 35 ASCII letters


def _rejection(out: list[tuple[str, object]]) -> RequestRejected:
    (only,) = out
    assert only[0] == "streamer" and isinstance(only[1], RequestRejected)
    return only[1]


def test_megabyte_prompt_is_rejected_by_the_bound(tok: TextTokenizer) -> None:
    core = TokenizerCore(tok, max_model_len=8192)
    prompt = PROSE * 87_000  # 3.9 MB, 870,000 tokens
    rejected = _rejection(core.handle([_req("big", prompt=prompt)]))
    # 3,045,000 letters, at most 25 per SmolLM2 token: the bound, not a tokenization.
    assert rejected == RequestRejected(
        request_id="big",
        code=RejectCode.TOO_LONG,
        field="prompt",
        message="prompt has at least 121800 tokens; max_model_len is 8192 "
        "(the prompt must leave room for at least one generated token)",
    )


def test_long_prompt_under_the_bound_stops_at_the_limit(tok: TextTokenizer) -> None:
    core = TokenizerCore(tok, max_model_len=1000)
    prompt = PROSE * 500  # 5,000 tokens; the bound says only >= 700
    rejected = _rejection(core.handle([_req("long", prompt=prompt)]))
    assert rejected.code == RejectCode.TOO_LONG and rejected.field == "prompt"
    # Stopped within one chunk (16,384 characters, ~3,700 tokens) of the limit.
    count = int(rejected.message.split("at least ")[1].split(" ")[0])
    assert 1000 <= count < 5000


def test_long_prompts_and_chats_under_the_limit_encode_exactly(tok: TextTokenizer) -> None:
    core = TokenizerCore(tok, max_model_len=100_000)
    prompt = PROSE * 1_500  # 67 KB: encoded alone, in five chunks
    messages = (ChatMessage(role="user", content=prompt),)
    out = core.handle([_req("p", prompt=prompt), _req("c", messages=messages)])
    chat_text = tok.render_chat([{"role": "user", "content": prompt}])
    assert [type(m).__name__ for _, m in out] == ["RequestOpened", "TokenizedRequest"] * 2
    p, c = out[1][1], out[3][1]
    assert isinstance(p, TokenizedRequest) and isinstance(c, TokenizedRequest)
    assert p.prompt_token_ids == tuple(tok.encode(prompt))
    assert c.prompt_token_ids == tuple(tok.encode(chat_text, add_special_tokens=False))
    assert len(p.prompt_token_ids) == 15_001  # 1,500 x 10, and the trailing space


def test_long_chat_is_rejected_as_admission_would(tok: TextTokenizer) -> None:
    core = TokenizerCore(tok, max_model_len=8192)
    messages = (ChatMessage(role="user", content=PROSE * 87_000),)
    rejected = _rejection(core.handle([_req("c", messages=messages)]))
    # Admission's shape: field "prompt" for chats too.
    assert rejected.code == RejectCode.TOO_LONG and rejected.field == "prompt"
    assert rejected.message.startswith("prompt has at least ")


def test_too_many_prompt_token_ids_are_rejected_before_the_vocab_scan(tok: TextTokenizer) -> None:
    core = TokenizerCore(tok, max_model_len=8)
    rejected = _rejection(core.handle([_req("t", prompt_token_ids=(1,) * 7 + (10**9,))]))
    assert rejected == RequestRejected(
        request_id="t",
        code=RejectCode.TOO_LONG,
        field="prompt",
        message="prompt has 8 tokens; max_model_len is 8 "
        "(the prompt must leave room for at least one generated token)",
    )


@pytest.mark.parametrize("max_model_len", [None, 8192])
def test_lone_surrogate_is_rejected_and_harms_nobody(
    tok: TextTokenizer, max_model_len: int | None
) -> None:
    # The Rust tokenizer raises TypeError on it, which would have crashed the actor.
    core = TokenizerCore(tok, max_model_len=max_model_len)
    bad_chat = (ChatMessage(role="user", content="hi \udc80"),)
    out = core.handle(
        [_req("s", prompt="ok \ud800 no"), _req("c", messages=bad_chat), _req("g", prompt="fine")]
    )
    s, c = out[0][1], out[1][1]
    assert isinstance(s, RequestRejected) and s.code == RejectCode.INVALID_REQUEST
    assert s.field == "prompt"
    assert s.message == "prompt is not valid Unicode text: lone surrogate '\\ud800' at character 3"
    assert isinstance(c, RequestRejected) and c.field == "messages"
    assert [type(m).__name__ for _, m in out[2:]] == ["RequestOpened", "TokenizedRequest"]


def test_graph_builds_the_tokenizer_with_max_model_len(tok: TextTokenizer) -> None:
    from troupe.actors.graph import GraphInputs, build_tokenizer
    from troupe.config import EngineConfig
    from troupe.messages.trace import RunnerNumbers

    def numbers(max_model_len: int) -> RunnerNumbers:
        return RunnerNumbers(
            block_size=16,
            num_gpu_blocks=8,
            num_cpu_blocks=0,
            vocab_size=tok.vocab_size,
            max_model_len=max_model_len,
            eos_token_ids=(2,),
        )

    core = build_tokenizer(GraphInputs(EngineConfig(), numbers(4), tok))
    (out,) = core.handle([_req("g", prompt_token_ids=(1, 2, 3, 4))])
    assert isinstance(out[1], RequestRejected) and out[1].code == RejectCode.TOO_LONG
    roomy = build_tokenizer(GraphInputs(EngineConfig(), numbers(5), tok))
    assert [box for box, _ in roomy.handle([_req("g", prompt_token_ids=(1, 2, 3, 4))])] == [
        "streamer",
        "admission",
    ]


def test_add_special_tokens_overrides_each_kinds_default(tok: TextTokenizer) -> None:
    """vLLM's add_special_tokens: a text prompt gets the model's BOS by default and not with
    False; rendered chat gets none by default and one more with True; in one batch, and for a
    long text encoded in chunks alike."""
    with_bos = Tokenizer.from_str(tok.tokenizer.to_str())
    with_bos.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)]
    )
    bos_tok = TextTokenizer(
        with_bos,
        source="smollm2+bos",
        bos_token_id=1,
        eos_token_ids=(2,),
        chat_template=tok.chat_template,
    )
    core = TokenizerCore(bos_tok, max_model_len=100_000)
    messages = (ChatMessage(role="user", content="Hi"),)
    chat = tuple(tok.encode(tok.render_chat([{"role": "user", "content": "Hi"}]), False))
    long = PROSE * 1_500  # encoded alone, in chunks
    plain = tuple(tok.encode("Hello world", False))

    def params(special: bool | None) -> SamplingParams:
        return SamplingParams(max_tokens=5, add_special_tokens=special)

    batch = [
        GenerateRequest(request_id=name, params=params(special), arrival_time=0.0, **prompt)
        for name, special, prompt in [
            ("p", None, {"prompt": "Hello world"}),
            ("p-off", False, {"prompt": "Hello world"}),
            ("c", None, {"messages": messages}),
            ("c-on", True, {"messages": messages}),
            ("p-on", True, {"prompt": "Hello world"}),
            ("long-off", False, {"prompt": long}),
            ("long", None, {"prompt": long}),
        ]
    ]
    out = core.handle(batch)
    admitted = {m.request_id: m.prompt_token_ids for _, m in out if isinstance(m, TokenizedRequest)}
    assert admitted == {
        "p": (1, *plain),
        "p-off": plain,
        "c": chat,
        "c-on": (1, *chat),
        "p-on": (1, *plain),
        "long-off": tuple(tok.encode(long, False)),
        "long": (1, *tok.encode(long, False)),
    }
    assert chat[0] == 1 and chat[1] != 1  # the template's own <|im_start|>, once by default
