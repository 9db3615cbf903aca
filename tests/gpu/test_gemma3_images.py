"""Gemma 3's images end to end on the CPU: a tiny random Gemma3ForConditionalGeneration (a
SigLIP tower pooled 4x4 -> 2x2, windowed and global layers) saved with Gemma3Processor's
files. Its language model's rows of one image attend to each other (transformers'
token_type_ids mask): the engine's greedy tokens equal transformers' on what Gemma3Processor
makes of the same PNG bytes, with a step budget that would cut an image (the scheduler keeps
it in one chunk), beside text prompts, and after a prefix-cache hit; a budget below one
image's rows is refused by name."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from troupe import Engine
from troupe.config import ConfigError, EngineConfig
from troupe.messages import Finished

from tests.gpu.family_checks import saved_random_model
from tests.gpu.test_llava_images import GREEDY, NUM_NEW, _messages, _png, _prompt
from tests.graph_helpers import collect, collect_all, terminal, token_ids, wait_blocks_free

BOI, EOI, IMAGE = 297, 298, 299
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ 'w1 ' if m.role == 'user' else 'w2 ' }}"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
    "{% if p.type == 'image' %}{{ '<start_of_image>' }}{% else %}{{ p.text }}{% endif %}"
    "{% endfor %}{% endif %}{{ ' w3 ' }}{% endfor %}{% if add_generation_prompt %}w2{% endif %}"
)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    """(folder, transformers' model, Gemma3Processor) of a tiny random Gemma 3."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
        PreTrainedTokenizerFast,
    )

    folder = tmp_path_factory.mktemp("gemma3")
    text = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
            "vocab_size": 300, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
            "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "sliding_window": 6,
            "layer_types": ["sliding_attention", "full_attention"], "query_pre_attn_scalar": 16,
            "rope_theta": 1000.0, "tie_word_embeddings": False}  # fmt: skip
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "image_size": 56, "patch_size": 14}  # fmt: skip
    config = Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4,
        image_token_index=IMAGE, boi_token_index=BOI, eoi_token_index=EOI,
        tie_word_embeddings=False,
    )  # fmt: skip
    hf_model = saved_random_model(folder, Gemma3ForConditionalGeneration, config, norms=True)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(BOI)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    names = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")
    tok.add_special_tokens([AddedToken(name, special=True) for name in names])
    assert [tok.token_to_id(name) for name in names] == [BOI, EOI, IMAGE]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="w0", bos_token="w1", eos_token="w2",
        extra_special_tokens={"boi_token": names[0], "eoi_token": names[1],
                              "image_token": names[2]},
    )  # fmt: skip
    images = Gemma3ImageProcessor(size={"height": 56, "width": 56})
    processor = Gemma3Processor(
        image_processor=images, tokenizer=fast, chat_template=TEMPLATE, image_seq_length=4
    )
    processor.save_pretrained(folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder, hf_model, processor


def _hf_greedy(gemma: tuple[Path, Any, Any], *contents: tuple[str | bytes, ...]) -> list[int]:
    _, model, processor = gemma
    text = processor.apply_chat_template(_messages(*contents), add_generation_prompt=True)
    pictures = [Image.open(io.BytesIO(c)) for content in contents for c in content
                if isinstance(c, bytes)]  # fmt: skip
    inputs = processor(text=text, images=pictures or None, return_tensors="pt")
    ids, new = inputs["input_ids"], []
    types = inputs.get("token_type_ids", torch.zeros_like(ids))
    assert int((ids == IMAGE).sum()) == 4 * len(pictures)
    with torch.no_grad():
        for _ in range(NUM_NEW):
            logits = model(
                input_ids=ids, pixel_values=inputs.get("pixel_values"), token_type_ids=types
            ).logits
            new.append(int(logits[0, -1].argmax()))
            ids = torch.cat([ids, torch.tensor([[new[-1]]])], dim=1)
            types = torch.cat([types, torch.zeros(1, 1, dtype=types.dtype)], dim=1)
    return new


def _config(folder: Path, **changes: Any) -> EngineConfig:
    base = {"model": str(folder), "device": "cpu", "max_model_len": 128, "num_kv_blocks": 64,
            "block_size": 4, "max_num_seqs": 4, "gc_freeze": False}  # fmt: skip
    return EngineConfig(**(base | changes))


CONTENTS = [
    ((_png(21), "w5 w6 w7"),),
    ((_png(22, (80, 40)), "w9"), (_png(23), "w10 w11 w12")),
    (("w30 w31 w32 w33 w34 w35 w36",),),  # text alone beside them
]


@pytest.fixture(scope="module")
def expected(gemma: tuple[Path, Any, Any]) -> list[list[int]]:
    return [_hf_greedy(gemma, *c) for c in CONTENTS]


@pytest.mark.anyio
@pytest.mark.parametrize("budget", [64, 5], ids=["whole", "cutting"])
async def test_greedy_equals_transformers(
    gemma: tuple[Path, Any, Any], expected: list[list[int]], budget: int
) -> None:
    """A budget of 5 tokens would end chunks inside the 4-row images: they wait for a chunk
    of their own. Together, the steps batch images, text and decodes."""
    async with Engine.open(_config(gemma[0], max_num_batched_tokens=budget)) as engine:
        events = await collect_all(engine, [(_prompt(*c), GREEDY) for c in CONTENTS])
        for one in events:
            assert isinstance(terminal(one), Finished), one[-1]
        assert [token_ids(e) for e in events] == expected
        # again: a prefix hit (blocks of 4 may end inside an image), the same tokens
        await wait_blocks_free(engine)
        assert token_ids(await collect(engine, _prompt(*CONTENTS[1]), GREEDY)) == expected[1]
        await wait_blocks_free(engine)
        assert engine.stats().prefix_cache_hit_tokens > 0


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["recompute", "swap"])
async def test_preempted_mid_image(
    gemma: tuple[Path, Any, Any], expected: list[list[int]], mode: str
) -> None:
    """A pool too small for the three at once: whether they are preempted depends on how
    they arrive (tests/actors/core/test_scheduler_images.py preempts deterministically);
    nobody waits forever and the tokens stay."""
    config = _config(gemma[0], max_num_batched_tokens=5, num_kv_blocks=10, preemption_mode=mode,
                     enable_prefix_caching=False)  # fmt: skip
    async with Engine.open(config) as engine:
        events = await collect_all(engine, [(_prompt(*c), GREEDY) for c in CONTENTS])
        await wait_blocks_free(engine)
        stats = engine.stats()
    assert [token_ids(e) for e in events] == expected
    assert stats.num_gpu_blocks_used == stats.num_cpu_blocks_used == 0, stats


@pytest.mark.anyio
async def test_a_budget_below_one_image_is_refused(gemma: tuple[Path, Any, Any]) -> None:
    with pytest.raises(ConfigError, match="max_num_batched_tokens 3 is below the 4 rows"):
        async with Engine.open(_config(gemma[0], max_num_batched_tokens=3)):
            pass


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_gemma3_images_on_cuda(
    gemma: tuple[Path, Any, Any], expected: list[list[int]], eager: bool
) -> None:
    """fp32 on CUDA: steps with image rows take the reference attention with key limits
    (eagerly, out of the mixed-step graphs); decodes keep their graphs. The pool is sized
    from the memory profile, the encoder's peak in it (gpu/activation_profile.py)."""
    import anyio

    config = _config(gemma[0], device="cuda", dtype="float32", max_num_batched_tokens=5,
                     enforce_eager=eager, num_kv_blocks=None,
                     gpu_memory_utilization=0.3)  # fmt: skip

    async def run() -> list[list[int]]:
        async with Engine.open(config) as engine:
            events = await collect_all(engine, [(_prompt(*c), GREEDY) for c in CONTENTS])
            await wait_blocks_free(engine)
        return [token_ids(e) for e in events]

    assert anyio.run(run) == expected
