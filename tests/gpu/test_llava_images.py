"""Images in chat prompts, end to end on the CPU: a tiny random LLaVA (a CLIP tower, the MLP
projector, a Llama) saved as transformers saves it, with a word-level tokenizer that holds
`<image>`, a template that writes one per image part, and LlavaProcessor's own files. The
engine's greedy tokens equal transformers' `generate` on what LlavaProcessor makes of the same
PNG bytes (pixels and expanded ids). Also: two images, an image cut by chunked prefill,
prefix-cache hits only over the same image, and each refusal naming its field; every block
comes back."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import torch
from PIL import Image
from troupe import Engine
from troupe.config import EngineConfig
from troupe.messages import ChatMessage, ChatPart, ChatPrompt, Finished, Rejected, SamplingParams

from tests.gpu.family_checks import saved_random_model
from tests.graph_helpers import (
    by_index,
    collect,
    collect_all,
    terminal,
    token_ids,
    wait_blocks_free,
)

IMAGE_ID = 299
TEMPLATE = (
    "{% for m in messages %}{{ 'w1 ' if m.role == 'user' else 'w2 ' }}"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
    "{% if p.type == 'image' %}{{ '<image>' }}{% else %}{{ p.text }}{% endif %}"
    "{% endfor %}{% endif %}{{ ' w3 ' }}{% endfor %}{% if add_generation_prompt %}w2{% endif %}"
)
NUM_NEW = 8
pytestmark = pytest.mark.slow


def _png(seed: int, size: tuple[int, int] = (40, 33)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    return tiny_llava(tmp_path_factory.mktemp("llava"))


def tiny_llava(folder: Path) -> tuple[Path, Any, Any]:
    """(folder, transformers' model, LlavaProcessor) of a tiny random LLaVA saved in `folder`."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import (
        CLIPImageProcessor,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    text = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "intermediate_size": 96, "vocab_size": 300, "max_position_embeddings": 256,
            "rms_norm_eps": 1e-5, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
    vision = {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 28,
              "patch_size": 14, "projection_dim": 32}  # fmt: skip
    config = LlavaConfig(
        text_config=text, vision_config=vision, image_token_index=IMAGE_ID,
        tie_word_embeddings=False,
    )  # fmt: skip
    hf_model = saved_random_model(folder, LlavaForConditionalGeneration, config, norms=True)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(IMAGE_ID)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("<image>", special=True)])
    assert tok.token_to_id("<image>") == IMAGE_ID
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="w0", eos_token="w2", extra_special_tokens={}
    )
    images = CLIPImageProcessor(size={"shortest_edge": 28}, crop_size=28)
    processor = LlavaProcessor(
        image_processor=images, tokenizer=fast, patch_size=14, chat_template=TEMPLATE,
        vision_feature_select_strategy="default", num_additional_image_tokens=1,
        image_token="<image>",
    )  # fmt: skip
    processor.save_pretrained(folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE  # where troupe reads a template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder, hf_model, processor


def _messages(*contents: tuple[str | bytes, ...]) -> list[dict[str, Any]]:
    """HF's chat messages (image parts as {"type": "image"})."""
    return [
        {"role": "user", "content": [
            {"type": "image"} if isinstance(c, bytes) else {"type": "text", "text": c}
            for c in content
        ]}
        for content in contents
    ]  # fmt: skip


def _prompt(*contents: tuple[str | bytes, ...]) -> ChatPrompt:
    """troupe's chat prompt of the same messages (image parts carry their PNG bytes)."""
    return ChatPrompt(
        messages=tuple(
            ChatMessage(
                role="user",
                content="\n".join(c for c in content if isinstance(c, str)),
                parts=tuple(
                    ChatPart(type="image", image=c)
                    if isinstance(c, bytes)
                    else ChatPart(type="text", text=c)
                    for c in content
                ),
            )
            for content in contents
        )
    )


def _hf_greedy(llava: tuple[Path, Any, Any], *contents: tuple[str | bytes, ...]) -> list[int]:
    _, model, processor = llava
    text = processor.apply_chat_template(_messages(*contents), add_generation_prompt=True)
    pictures = [Image.open(io.BytesIO(c)) for content in contents for c in content
                if isinstance(c, bytes)]  # fmt: skip
    inputs = processor(text=text, images=pictures, return_tensors="pt")
    ids, new = inputs["input_ids"], []
    with torch.no_grad():  # greedy past the eos (the engine's ignore_eos): the whole prefix
        for _ in range(NUM_NEW):
            logits = model(input_ids=ids, pixel_values=inputs["pixel_values"]).logits
            new.append(int(logits[0, -1].argmax()))
            ids = torch.cat([ids, torch.tensor([[new[-1]]])], dim=1)
    return new


def _config(folder: Path, **changes: Any) -> EngineConfig:
    base = {"model": str(folder), "device": "cpu", "max_model_len": 128, "num_kv_blocks": 64,
            "block_size": 4, "max_num_seqs": 4, "gc_freeze": False}  # fmt: skip
    return EngineConfig(**(base | changes))


GREEDY = SamplingParams(max_tokens=NUM_NEW, temperature=0.0, ignore_eos=True)


@pytest.mark.anyio
async def test_greedy_equals_transformers_with_images(llava: tuple[Path, Any, Any]) -> None:
    one = ((_png(1), "w5 w6 w7"),)
    two = ((_png(2, (20, 50)), "w9"), (_png(3), "w10 w11"))
    want_one, want_two = _hf_greedy(llava, *one), _hf_greedy(llava, *two)
    async with Engine.open(_config(llava[0])) as engine:
        got = await collect(engine, _prompt(*one), GREEDY)
        assert isinstance(terminal(got), Finished), got[-1]
        assert token_ids(got) == want_one
        await wait_blocks_free(engine)
        # the same prompt again: cached blocks over the image, the same tokens (at once: the
        # CPU's allocator reuses freed blocks before it touches new ones, evicting them)
        again = await collect(engine, _prompt(*one), GREEDY)
        assert token_ids(again) == want_one
        await wait_blocks_free(engine)
        hits = engine.stats().prefix_cache_hit_tokens
        assert hits > 0
        assert token_ids(await collect(engine, _prompt(*two), GREEDY)) == want_two
        # another image at the same places: no block over the first image is served to it
        # (the one block before it is: a text prefix is shared whatever follows)
        other = ((_png(4), "w5 w6 w7"),)
        assert token_ids(await collect(engine, _prompt(*other), GREEDY)) == _hf_greedy(
            llava, *other
        )
        await wait_blocks_free(engine)
        assert engine.stats().prefix_cache_hit_tokens == hits


@pytest.mark.anyio
async def test_chunks_that_cut_an_image(llava: tuple[Path, Any, Any]) -> None:
    """A step budget of 3 tokens: each image's 4 rows come in two or three chunks."""
    two = ((_png(5), "w12"), (_png(6), "w13"))
    config = _config(llava[0], max_num_batched_tokens=3, enable_prefix_caching=False)
    async with Engine.open(config) as engine:
        assert token_ids(await collect(engine, _prompt(*two), GREEDY)) == _hf_greedy(llava, *two)
        await wait_blocks_free(engine)


@pytest.mark.anyio
async def test_refusals_name_their_field(llava: tuple[Path, Any, Any]) -> None:
    async with Engine.open(_config(llava[0], limit_images_per_prompt=1)) as engine:
        cases = [
            (_prompt((_png(1), "w5"), (_png(2), "w6")), "messages", "limit_images_per_prompt"),
            (_prompt((b"not a picture", "w5")), "messages[0].content[0]", "not an image"),
            # the user's text writes the placeholder itself: two for one image part
            (_prompt((_png(1), "w5 <image>")), "messages", "2 image placeholders"),
        ]
        for prompt, field, words in cases:
            end = terminal(await collect(engine, prompt, GREEDY))
            assert isinstance(end, Rejected) and end.field == field, end
            assert words in end.message, end.message
        await wait_blocks_free(engine)
    # a model that reads no images names the part
    async with Engine.open(_config(llava[0], limit_images_per_prompt=0)) as engine:
        end = terminal(await collect(engine, _prompt((_png(1), "w5")), GREEDY))
        assert isinstance(end, Rejected) and end.field == "messages[0].content[0]", end
        assert "takes no images" in end.message


BATCH = [((_png(10 + i, (30 + 7 * i, 28)), f"w{20 + i} w{40 + i}"),) for i in range(3)] + [
    ((_png(13), "w50"), (_png(14, (60, 30)), "w51 w52"))
]


async def _batch(config: EngineConfig) -> tuple[list[list[int]], Any]:
    """The BATCH prompts together (their steps batched, images of one size encoded at once);
    their tokens, and the stats at the end."""
    async with Engine.open(config) as engine:
        events = await collect_all(engine, [(_prompt(*c), GREEDY) for c in BATCH])
        await wait_blocks_free(engine)
        stats = engine.stats()
    for one in events:
        assert isinstance(terminal(one), Finished), one[-1]
    return [token_ids(one) for one in events], stats


@pytest.fixture(scope="module")
def batch_expected(llava: tuple[Path, Any, Any]) -> list[list[int]]:
    return [_hf_greedy(llava, *contents) for contents in BATCH]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["recompute", "swap"])
async def test_preempted_requests_with_images(
    llava: tuple[Path, Any, Any], batch_expected: list[list[int]], mode: str
) -> None:
    """Too few blocks for the batch: requests are preempted mid-prompt or mid-answer and come
    back by recomputing (their images encoded again) or by swap."""
    config = _config(
        llava[0], num_kv_blocks=9, preemption_mode=mode, max_num_batched_tokens=6,
        enable_prefix_caching=False,
    )  # fmt: skip
    got, stats = await _batch(config)
    assert got == batch_expected
    assert getattr(stats, f"num_preemptions_{mode}") > 0, stats


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_images_on_cuda(
    llava: tuple[Path, Any, Any], batch_expected: list[list[int]], eager: bool
) -> None:
    """fp32 on CUDA: the encoder on the device, the rows through mixed-step graphs (captured
    mask and value buffers) or eager steps."""
    config = _config(
        llava[0], device="cuda", dtype="float32", max_num_batched_tokens=8, enforce_eager=eager
    )
    assert anyio.run(_batch, config)[0] == batch_expected


@pytest.mark.anyio
async def test_openai_dicts(llava: tuple[Path, Any, Any]) -> None:
    """Messages as dicts in OpenAI's shape (vLLM's LLM.chat): a data URL's image gives the
    ChatParts' tokens; an http URL reaches an engine that fetches nothing: named."""
    import base64

    url = "data:image/png;base64," + base64.b64encode(_png(1)).decode()
    chat = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "w5 w6 w7"}
    ]}]  # fmt: skip
    async with Engine.open(_config(llava[0])) as engine:
        want = token_ids(await collect(engine, _prompt((_png(1), "w5 w6 w7")), GREEDY))
        assert token_ids(await collect(engine, chat, GREEDY)) == want
        chat[0]["content"][0] = {"type": "image_url", "image_url": "https://images.example/a.png"}
        end = terminal(await collect(engine, chat, GREEDY))
        assert isinstance(end, Rejected) and end.field == "messages[0].content[0]", end
        assert "fetches no URL" in end.message
        await wait_blocks_free(engine)


@pytest.mark.anyio
async def test_images_encoded_one_at_a_time(
    llava: tuple[Path, Any, Any], batch_expected: list[list[int]], monkeypatch: Any
) -> None:
    """The encoder's batches capped at one image (embed_rows.ENCODE_BATCH) change nothing."""
    from troupe.gpu import embed_rows

    monkeypatch.setattr(embed_rows, "ENCODE_BATCH", 1)
    got, _ = await _batch(_config(llava[0], max_num_batched_tokens=64))
    assert got == batch_expected


@pytest.mark.anyio
async def test_text_before_an_image_is_shared(llava: tuple[Path, Any, Any]) -> None:
    """Blocks before an image are cached as any text is: a prompt with another image after
    the same text hits them (and only them), and answers as transformers does."""
    text = "w40 w41 w42 w43 w44 w45 w46 w47 w48"  # with the template's first word: 2 blocks
    first, second = ((text, _png(30), "w5"),), ((text, _png(31), "w5"),)
    async with Engine.open(_config(llava[0])) as engine:
        await collect(engine, _prompt(*first), GREEDY)
        await wait_blocks_free(engine)
        before = engine.stats().prefix_cache_hit_tokens
        got = await collect(engine, _prompt(*second), GREEDY)
        assert token_ids(got) == _hf_greedy(llava, *second)
        await wait_blocks_free(engine)
        assert engine.stats().prefix_cache_hit_tokens - before == 8


@pytest.mark.anyio
@pytest.mark.parametrize("spec", [{}, {"speculative_method": "ngram", "num_speculative_tokens": 3}])
async def test_samples_and_proposals_over_images(
    llava: tuple[Path, Any, Any], spec: dict[str, Any]
) -> None:
    """n = 2 greedy samples fork after the image's prefill, both transformers' tokens; with
    n-gram proposals (which may propose the image token) the verified answer is the same."""
    one = ((_png(1), "w5 w6 w7"),)
    want = _hf_greedy(llava, *one)
    async with Engine.open(_config(llava[0], **spec)) as engine:
        params = SamplingParams(max_tokens=NUM_NEW, temperature=0.0, ignore_eos=True, n=2)
        events = await collect(engine, _prompt(*one), params if not spec else GREEDY)
        samples = by_index(events)  # one end each
        assert all(isinstance(s[-1], Finished) for s in samples.values()), events
        assert all(token_ids(s) == want for s in samples.values())
        assert len(samples) == (1 if spec else 2)
        await wait_blocks_free(engine)


@pytest.mark.anyio
async def test_a_text_prompt_with_multi_modal_data(llava: tuple[Path, Any, Any]) -> None:
    """vLLM's {"prompt": ..., "multi_modal_data": {"image": ...}}: the prompt writes the
    placeholder itself; bytes and a PIL image give the chat prompt's tokens; a count that
    differs names the prompt."""
    png = _png(1)
    async with Engine.open(_config(llava[0])) as engine:
        want = token_ids(await collect(engine, _prompt((png, "w5 w6 w7")), GREEDY))
        text = "w1 <image>w5 w6 w7 w3 w2"  # what the template renders for that message
        for image in (png, [Image.open(io.BytesIO(png))]):
            prompt = {"prompt": text, "multi_modal_data": {"image": image}}
            assert token_ids(await collect(engine, prompt, GREEDY)) == want
        prompt = {"prompt": "w1 w5", "multi_modal_data": {"image": png}}
        end = terminal(await collect(engine, prompt, GREEDY))
        assert isinstance(end, Rejected) and end.field == "prompt", end
        assert "0 image placeholders" in end.message
        await wait_blocks_free(engine)
