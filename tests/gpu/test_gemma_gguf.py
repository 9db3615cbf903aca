"""Gemma 3 and Gemma 2 from a GGUF file (gpu/gguf_arch.py, actors/core/tokenizer_spm.py): a
tiny random model written as llama.cpp writes one (norms stored as 1 + w, no q/k permutation, a
sentencepiece vocabulary without merges, Q8_0 and F16 tensors; Gemma 2's caps in the metadata),
loaded by transformers (`gguf_file=`) and by troupe: the same config, the same token ids for
text, and greedy tokens identical over prompts longer than the window. The real Gemma 3 270M file is checked the same
way by `python -m troupe.ops.gemma3_gguf_check` (docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from troupe.actors.core.tokenizer_gguf import load_gguf_tokenizer
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.weights import random_weights

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

WINDOW = 6
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
PIECES = [
    "\u2581",
    "\u2581t",
    "he",
    "\u2581the",
    "ll",
    "llo",
    "\u2581he",
    "\u2581hello",
    "  ",
    "\u2581a",
]
PIECES += ["\u2581w", "or", "ld", "\u2581wor", "\u2581world", "\n", "\n\n", "\u2581\u2581"]
USER = ["<start_of_turn>", "<end_of_turn>"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
TOKENS = SPECIAL + [f"<0x{b:02X}>" for b in range(256)] + USER + LETTERS + PIECES
TYPES = [3] * len(SPECIAL) + [6] * 256 + [4] * len(USER) + [1] * (len(LETTERS) + len(PIECES))
TEXTS = ["hello world", "the  hello\n\nworld", " a tell", "<start_of_turn>hi é 日", "xyz\tq"]


def _hf_config(arch: str = "gemma3") -> Any:
    """Gemma 3: five local layers, then a global one (the file's default); Gemma 2: every other
    layer local, caps of 50 and 30 (what transformers assumes: its GGUF loader reads no caps)."""
    config_cls = transformers.Gemma3TextConfig if arch == "gemma3" else transformers.Gemma2Config
    return config_cls(
        hidden_size=64,
        num_hidden_layers=6,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=96,
        vocab_size=len(TOKENS),
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        sliding_window=WINDOW,
        rope_theta=1_000_000.0,
        # tied, Gemma 3's embedding (x 8) echoes the last token; Gemma 2's files are tied
        # (transformers' loader drops their output.weight)
        tie_word_embeddings=arch == "gemma2",
    )


def _write_gguf(path: Path, weights: dict[str, torch.Tensor], arch: str = "gemma3") -> None:
    writer = gguf.GGUFWriter(str(path), arch)
    cfg = _hf_config(arch)
    a = f"{arch}."
    for key, value in {
        "context_length": 256,
        "embedding_length": cfg.hidden_size,
        "block_count": cfg.num_hidden_layers,
        "feed_forward_length": cfg.intermediate_size,
        "attention.head_count": cfg.num_attention_heads,
        "attention.head_count_kv": cfg.num_key_value_heads,
        "attention.key_length": cfg.head_dim,
        "attention.value_length": cfg.head_dim,
        "attention.sliding_window": WINDOW,
    }.items():
        writer.add_uint32(a + key, value)
    writer.add_float32(a + "attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    writer.add_float32(a + "rope.freq_base", 1_000_000.0)
    if arch == "gemma2":
        writer.add_float32(a + "attn_logit_softcapping", 50.0)
        writer.add_float32(a + "final_logit_softcapping", 30.0)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([-1000.0] * len(SPECIAL) + [0.0] * (len(TOKENS) - len(SPECIAL)))
    writer.add_token_types(TYPES)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    if arch == "gemma3":
        per_layer |= {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    for layer in range(cfg.num_hidden_layers):
        for hf, ours in per_layer.items():
            names[f"model.layers.{layer}.{hf}.weight"] = f"blk.{layer}.{ours}.weight"
    for hf, name in names.items():
        if hf not in weights:  # tied: no lm_head
            continue
        data = weights[hf].numpy().astype(np.float32)
        if name.endswith("norm.weight"):
            writer.add_tensor(name, data + 1.0)  # as llama.cpp stores Gemma's norms
        elif "attn_q." in name or "ffn_up" in name:
            q8 = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module", params=["gemma3", "gemma2"])
def gemma_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    arch = request.param
    ours = ModelConfig.from_hf_dict(_hf_config(arch).to_dict())
    weights = random_weights(ours, torch.float32, seed=3, std=0.2)
    if ours.tie_word_embeddings:  # the embedding (x 8) would echo the last token: scale it down
        weights["model.embed_tokens.weight"] /= 8
    path = tmp_path_factory.mktemp(arch) / f"tiny-{arch}.gguf"
    _write_gguf(path, weights, arch)
    return path


def test_config_and_tokenizer_equal_transformers(gemma_gguf: Path) -> None:
    from troupe.gpu.gguf_weights import read_gguf_config

    config = read_gguf_config(gemma_gguf)
    hf_config = transformers.AutoConfig.from_pretrained(
        str(gemma_gguf.parent), gguf_file=gemma_gguf.name
    )
    assert config == ModelConfig.from_hf_dict(hf_config.to_dict())
    assert config.is_gemma and config.head_dim == 32 and config.query_pre_attn_scalar == 256.0
    if config.model_type == "gemma3_text":
        assert config.layer_windows == (WINDOW,) * 5 + (0,)
        assert config.rope_local_theta == 10_000.0
    else:
        assert config.layer_windows == (WINDOW, 0) * 3 and config.rope_local_theta is None
        assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)
    hf_tok = transformers.AutoTokenizer.from_pretrained(
        str(gemma_gguf.parent), gguf_file=gemma_gguf.name
    )
    ours = load_gguf_tokenizer(gemma_gguf)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == hf_tok(text).input_ids, text
        assert ours.decode(ids) == hf_tok.decode(ids, skip_special_tokens=True), text
    assert ours.encode("  ")[1:] == [TOKENS.index("\u2581\u2581")]  # real spaces respelled


def test_greedy_equals_transformers_past_the_window(gemma_gguf: Path, mt: Any) -> None:
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gemma_gguf.parent), gguf_file=gemma_gguf.name, dtype=torch.float32
    ).eval()
    prompts = [[2, 300, 301, 290, 277, 281, 299, 300, 305, 288, 270], [2, 295, 296, 297]]
    expected = [mt.hf_greedy(hf_model, p, 10) for p in prompts]
    driver = mt.PlanDriver(mt.runner_for(gemma_gguf, max_model_len=128), chunk=4)
    for i, prompt in enumerate(prompts):
        driver.add(f"r{i}", prompt)
    driver.run(10)
    assert [driver.seqs[f"r{i}"].output for i in range(len(prompts))] == expected
    assert len(set(expected[0])) > 2  # the model is not stuck on one token
