"""LongRoPE (kernels/longrope.py): Phi-3.5's whole-head and Phi-4-mini's partial rotary with
short and long factors. An engine whose max_model_len passes the pretraining length rotates every
position with the long factors, as transformers rotates a sequence that long; one within it uses
the short ones. Each greedy token-identical to transformers (fp32) through chunked prefill, the
tables equal to transformers' cos/sin; and what config.json must give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.conftest import PlanDriver, hf_greedy, runner_for
from tests.gpu.family_checks import NUM_NEW, PROMPTS, TINY, saved_family

HEAD_DIM = TINY["hidden_size"] // TINY["num_attention_heads"]
LONG = 8  # a pretraining length every prompt passes: transformers rotates them all long
SHORT = 64  # one no sequence here reaches: short, with an engine of max_model_len SHORT


def longrope(rotated: int) -> dict[str, Any]:
    """Factors that differ per dim and between short and long, so a wrong pick shows."""
    pairs = rotated // 2
    return {
        "rope_type": "longrope",
        "rope_theta": 500.0,
        "short_factor": [1.0 + 0.1 * i for i in range(pairs)],
        "long_factor": [1.0 + 1.5 * i for i in range(pairs)],
    }


# name: (partial_rotary_factor, original_max_position_embeddings, the engine's max_model_len)
CASES = {
    "phi3.5-long": (1.0, LONG, 256),
    "phi4-mini-long": (0.75, LONG, 256),
    "phi3.5-short": (1.0, SHORT, SHORT),
}


def settings(name: str) -> dict[str, Any]:
    partial, original, _ = CASES[name]
    rope = longrope(int(HEAD_DIM * partial))
    return {**TINY, "partial_rotary_factor": partial, "rope_parameters": rope,
            "original_max_position_embeddings": original}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(CASES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, folder, saved_family(folder, "Phi3", settings(request.param))


def test_greedy_matches_hf(family: tuple[str, Path, Any]) -> None:
    name, folder, hf_model = family
    _, original, max_model_len = CASES[name]
    lengths = [len(p) for p in PROMPTS]
    assert min(lengths) > original or max(lengths) + NUM_NEW <= original  # one side throughout
    expected = [hf_greedy(hf_model, p, NUM_NEW) for p in PROMPTS]
    driver = PlanDriver(runner_for(folder, max_model_len=max_model_len), chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["phi3.5-long", "phi4-mini-long"], indirect=True)
def test_cuda_kernels_match_hf(family: tuple[str, Path, Any]) -> None:
    from tests.gpu.family_checks import assert_greedy_matches

    assert_greedy_matches(*family[1:], device="cuda")


@pytest.mark.parametrize("name", sorted(CASES))
def test_tables_are_transformers_cos_and_sin(name: str) -> None:
    """Long: every row as transformers rotates a sequence past the pretraining length; short:
    as it rotates one within it. Both scaled by transformers' attention factor."""
    import transformers
    from troupe.gpu.model_config import ModelConfig
    from troupe.kernels.rope_cache import build_cos_sin_cache

    _, original, max_model_len = CASES[name]
    hf_config = transformers.Phi3Config(**settings(name))
    rotary = transformers.Phi3ForCausalLM(hf_config).model.rotary_emb
    ours = ModelConfig.from_hf_dict(hf_config.to_dict())
    assert ours.rope_scaling is not None and ours.rope_scaling["factor"] == 256 / original
    table = build_cos_sin_cache(ours.rope_dim, max_model_len, ours.rope_theta,
                                ours.rope_scaling, torch.float32, "cpu")  # fmt: skip
    cos, sin = rotary(torch.zeros(1, 1, HEAD_DIM), torch.arange(max_model_len)[None])
    half = ours.rope_dim // 2
    assert torch.equal(table[:, :half], cos[0, :, :half])
    assert torch.equal(table[:, half:], sin[0, :, :half])
    assert rotary.attention_scaling > 1
    # the other set differs, so the pick is seen: the first rows of a table of `original`
    other = build_cos_sin_cache(ours.rope_dim, original, ours.rope_theta, ours.rope_scaling,
                                torch.float32, "cpu")  # fmt: skip
    assert torch.equal(other, table[:original]) == (max_model_len <= original)


def test_config_json_errors_name_the_field() -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError

    base = {"model_type": "phi3", "num_attention_heads": 4, "hidden_size": 64,
            "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 256,
            "max_position_embeddings": 256, "original_max_position_embeddings": LONG}  # fmt: skip
    good = longrope(HEAD_DIM)
    config = ModelConfig.from_hf_dict({**base, "rope_scaling": good})
    assert config.rope_scaling is not None
    assert config.rope_scaling["original_max_position_embeddings"] == LONG
    short = {**good, "long_factor": good["long_factor"][:-1]}
    with pytest.raises(ModelLoadError, match="long_factor has 7 entries; expected 8"):
        ModelConfig.from_hf_dict({**base, "rope_scaling": short})
    partial = {**base, "partial_rotary_factor": 0.75, "rope_scaling": good}
    with pytest.raises(ModelLoadError, match="short_factor has 8 entries; expected 6"):
        ModelConfig.from_hf_dict(partial)
    missing = {k: v for k, v in good.items() if k != "short_factor"}
    with pytest.raises(ModelLoadError, match="longrope needs a list 'short_factor'"):
        ModelConfig.from_hf_dict({**base, "rope_scaling": missing})
