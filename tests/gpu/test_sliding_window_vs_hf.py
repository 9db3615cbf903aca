"""Sliding-window families, Gemma 2 and Gemma 3 text: greedy token-identical to HF transformers
(fp32, CPU) for prompts longer than the window, through chunked prefill and decode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.weights import random_weights

WINDOW = 5
TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "sliding_window": WINDOW,
}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "mistral": ("Mistral", {"rope_theta": 1000.0}),
    # layer 0 full, layer 1 windowed
    "qwen2": ("Qwen2", {"use_sliding_window": True, "max_window_layers": 1, "rope_theta": 1e3}),
    # layer 0 local (own RoPE base), layer 1 global with linear scaling; soft-capped logits
    "gemma3_text": (
        "Gemma3Text",
        {
            "head_dim": 32,
            "query_pre_attn_scalar": 24,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            },
            "final_logit_softcapping": 30.0,
            "tie_word_embeddings": False,  # tied, the embedding (x 8) echoes the last token
            "pad_token_id": 0,
        },
    ),
    # layer 0 local, layer 1 global, one RoPE base; attention scores capped at 3 (most of
    # these pass it: test_gemma2_cap_matters), logits at 30
    "gemma2": (
        "Gemma2",
        {
            "head_dim": 32,
            "query_pre_attn_scalar": 24,
            "rope_theta": 1000.0,
            "attn_logit_softcapping": 3.0,
            "final_logit_softcapping": 30.0,
            "tie_word_embeddings": False,
            "pad_token_id": 0,
        },
    ),
}
PROMPTS = [
    [5, 17, 42, 99, 3, 250, 7, 8, 64, 12, 31, 77, 2, 9],
    [200, 1, 77, 13, 90, 4, 4, 4, 18, 55, 3],
]
NUM_NEW = 12


def _hf_model(family: str, window: int = WINDOW) -> Any:
    import transformers

    name, extra = FAMILIES[family]
    config_cls = getattr(transformers, f"{name}Config")
    model_cls = getattr(
        transformers, "Gemma3ForCausalLM" if name == "Gemma3Text" else f"{name}ForCausalLM"
    )
    hf_config = config_cls(**{**TINY, **extra, "sliding_window": window})
    hf_config._attn_implementation = "eager"  # older transformers' SDPA drops Gemma 2's cap
    hf_model = model_cls(hf_config).eval()
    ours = ModelConfig.from_hf_dict(hf_config.to_dict())
    weights = random_weights(ours, torch.float32, seed=1, std=0.2)
    missing, unexpected = hf_model.load_state_dict(weights, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    if hf_config.tie_word_embeddings:
        hf_model.tie_weights()
    return hf_model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_windowed_greedy_matches_hf(family: str, tmp_path: Path, mt: Any) -> None:
    hf_model = _hf_model(family)
    folder = tmp_path / family
    hf_model.save_pretrained(folder)
    config = ModelConfig.from_hf_folder(folder)
    assert WINDOW in config.layer_windows
    # the window matters: without it the same weights give other logits
    with torch.no_grad():
        ids = torch.tensor([PROMPTS[0]])
        windowed = hf_model(ids).logits[0, -1]
        full = _hf_model(family, window=1000)(ids).logits[0, -1]
    assert (windowed - full).abs().max() > 1e-2
    expected = [mt.hf_greedy(hf_model, p, NUM_NEW) for p in PROMPTS]
    driver = mt.PlanDriver(mt.runner_for(folder), chunk=6)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    got = [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))]
    assert got == expected
    assert len(set(expected[0])) > 2  # the model is not stuck on one token


def test_released_blocks_keep_greedy_identical(tmp_path: Path, mt: Any) -> None:
    """The real scheduler and allocator release blocks behind the window (Mistral: every layer
    windowed) while the model runs 8x the window in a pool smaller than one request; tokens stay
    HF's."""
    from troupe.actors.core.allocator import AllocatorCore
    from troupe.actors.core.scheduler import SchedulerCore
    from troupe.actors.core.step_limits import StepLimits
    from troupe.messages import AdmittedRequest, SamplingParams
    from troupe.ops.bench_scheduler import CoreLoop

    hf_model = _hf_model("mistral")
    folder = tmp_path / "mistral"
    hf_model.save_pretrained(folder)
    num_blocks = 10
    runner = mt.runner_for(folder, num_gpu_blocks=num_blocks)
    assert runner.kv_window == WINDOW
    num_new = 8 * WINDOW
    scheduler = SchedulerCore(
        StepLimits(
            4, num_blocks, max_num_seqs=4, max_num_batched_tokens=8, kv_window=runner.kv_window
        ),
        num_cpu_blocks=0,
    )
    allocator = AllocatorCore(block_size=4, num_gpu_blocks=num_blocks, num_cpu_blocks=0)
    held: list[int] = []
    loop = CoreLoop(
        scheduler, allocator, runner, check=lambda a: held.append(num_blocks - a.gpu.num_free)
    )
    loop.submit(
        AdmittedRequest(
            request_id=f"r{i}",
            prompt_token_ids=tuple(p),
            params=SamplingParams(max_tokens=num_new, temperature=0.0, ignore_eos=True),
            arrival_time=0.0,
            max_total_tokens=len(p) + num_new,
        )
        for i, p in enumerate(PROMPTS)
    )
    loop.run()
    for i, p in enumerate(PROMPTS):
        assert loop.tokens[f"r{i}"] == mt.hf_greedy(hf_model, p, num_new)
    assert 4 * num_blocks < len(PROMPTS[0]) + num_new  # one request alone overflows it
    assert max(held) <= num_blocks
    assert loop.num_refused == 0 and allocator.gpu.num_free == num_blocks


def test_gemma2_cap_matters() -> None:
    """Gemma 2's config reads as transformers builds it, and the attention cap of the test
    model changes its logits (so the greedy tests above check the cap)."""
    hf_model = _hf_model("gemma2")
    config = ModelConfig.from_hf_dict(hf_model.config.to_dict())
    assert config.is_gemma and not config.qk_norm and config.rope_local_theta is None
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (3.0, 30.0)
    assert config.layer_windows == (WINDOW, 0)
    # transformers' defaults: every other layer local from layer 0, caps 50 and 30
    bare = {k: v for k, v in hf_model.config.to_dict().items() if "softcapping" not in k}
    bare = {**bare, "num_hidden_layers": 4, "layer_types": None}
    defaults = ModelConfig.from_hf_dict(bare)
    assert defaults.layer_windows == (WINDOW, 0, WINDOW, 0)
    assert (defaults.attn_logit_softcapping, defaults.final_logit_softcapping) == (50.0, 30.0)
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        capped = hf_model(ids).logits[0, -1]
        hf_model.config.attn_logit_softcapping = None
        for layer in hf_model.model.layers:
            layer.self_attn.attn_logit_softcapping = None
        uncapped = hf_model(ids).logits[0, -1]
    assert (capped - uncapped).abs().max() > 1e-1


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "mistral"])
def test_windowed_triton_ops_match_hf(family: str, tmp_path: Path, mt: Any) -> None:
    """On the Triton ops (under TRITON_INTERPRET=1 here) a windowed layer's prefill chunks take
    the extend kernel with the window (new keys from the fused qkv rows, the prefix within the
    window from the cache); the Gemmas mix local and global layers, Gemma 2's scores capped."""
    hf_model = _hf_model(family)
    folder = tmp_path / family
    hf_model.save_pretrained(folder)
    num_new = 4  # interpreter time
    expected = [mt.hf_greedy(hf_model, p, num_new) for p in PROMPTS]
    driver = mt.PlanDriver(mt.runner_for(folder, backend="triton"), chunk=6)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(num_new)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_cuda_kernels_match_hf(family: str, tmp_path: Path) -> None:
    """The Gemmas on CUDA (fp32; graphs for decode and mixed steps) against transformers."""
    from tests.gpu.family_checks import assert_greedy_matches

    hf_model = _hf_model(family)
    hf_model.save_pretrained(tmp_path / family)
    assert_greedy_matches(tmp_path / family, hf_model, device="cuda")
