"""The rotary tables per layer (gpu/rope_layers.py): YaRN on a Llama-shaped model (Qwen3), SmolLM3's
NoPE layers, OLMo 3's windowed layers beside yarn-scaled full ones, Ministral's layer_types
windows, and partial or interleaved rotary (Phi-3's halves, GLM's, GLM-4's, ERNIE 4.5's and
Helium's interleaved pairs, q/k reordered at load),
each greedy token-identical to HF transformers (fp32) through chunked prefill, from the
folder transformers saves; and what config.json may and may not say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY as FAMILY_TINY
from tests.gpu.family_checks import assert_greedy_matches, saved_family

TINY = {**FAMILY_TINY, "num_hidden_layers": 4}
# a short original context, so the interpolated frequencies and the attention factor matter
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-yarn": ("Qwen3", {"head_dim": 32, "rope_parameters": {**YARN, "rope_theta": 500.0}}),
    # layers 2 and 4 without RoPE; a model whose NoPE layers rotated would answer otherwise
    "smollm3": ("SmolLM3", {"no_rope_layer_interval": 2, "rope_theta": 500.0}),
    "olmo3": (
        "Olmo3",
        {
            "sliding_window": 5,
            "layer_types": LAYER_TYPES,
            "rope_parameters": {
                "full_attention": {**YARN, "rope_theta": 500.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
            },
        },
    ),
    "ministral": ("Ministral", {"head_dim": 16, "sliding_window": 5, "layer_types": LAYER_TYPES}),
    # half of each head rotated, in interleaved pairs; q/k/v biases, sandwich norms, gate_up fused
    "glm4": (
        "Glm4",
        {
            "partial_rotary_factor": 0.5,
            "attention_bias": True,
            "rope_theta": 100.0,
            "num_hidden_layers": 2,
        },
    ),
    # GLM-4-9B's (`glm`): the same rotary and biases in Llama's pre-norm layer
    "glm": (
        "Glm",
        {
            "partial_rotary_factor": 0.5,
            "attention_bias": True,
            "rope_theta": 100.0,
            "num_hidden_layers": 2,
        },
    ),
    # windowed layers beside a NoPE global one; post-norm layers with per-head q/k norms
    "exaone4": (
        "Exaone4",
        {"sliding_window": 5, "layer_types": [*["sliding_attention"] * 3, "full_attention"]},
    ),
    # the whole head rotated in interleaved pairs; a bias on every projection
    "ernie4_5": ("Ernie4_5", {"head_dim": 16, "use_bias": True, "rope_theta": 500.0}),
    # Helium: the whole head in interleaved pairs; q/k/v and MLP biases, none on o_proj
    "helium": (
        "Helium",
        {"head_dim": 16, "attention_bias": True, "mlp_bias": True, "rope_theta": 500.0},
    ),
    # three quarters rotated in halves; fused qkv_proj
    "phi3-partial": ("Phi3", {"partial_rotary_factor": 0.75, "rope_theta": 500.0}),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    name, extra = FAMILIES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, folder, saved_family(folder, name, {**TINY, **extra})


def test_greedy_matches_hf_with_chunked_prefill(family: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*family[1:])


def test_each_layer_reads_its_table(family: tuple[str, Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig
    from troupe.gpu.models import DecoderModel

    name, folder, _ = family
    config = ModelConfig.from_hf_folder(folder)
    model = DecoderModel(config, torch.float32, torch.device("cpu"), 64)
    expected = {
        "qwen3-yarn": ["cos_sin_cache"] * 4,
        "smollm3": ["cos_sin_cache", "cos_sin_none"] * 2,
        "olmo3": ["cos_sin_local", "cos_sin_cache"] * 2,
        "ministral": ["cos_sin_cache"] * 4,  # windowed, but one base and no scaling
        "glm": ["cos_sin_cache"] * 2,
        "glm4": ["cos_sin_cache"] * 2,
        "exaone4": ["cos_sin_cache"] * 3 + ["cos_sin_none"],
        "ernie4_5": ["cos_sin_cache"] * 4,
        "helium": ["cos_sin_cache"] * 4,
        "phi3-partial": ["cos_sin_cache"] * 4,
    }[name]
    assert model._rope_tables == expected
    if name == "smollm3":  # a broadcast row: cos 1, sin 0 at every position
        none = model.get_buffer("cos_sin_none")
        assert none.stride(0) == 0 and none[63].tolist() == [1.0] * 8 + [0.0] * 8


@pytest.mark.parametrize("family", ["smollm3"], indirect=True)
def test_triton_ops_read_the_broadcast_table(family: tuple[str, Path, Any]) -> None:
    """SmolLM3 on the Triton ops (TRITON_INTERPRET=1 here): the fused q/k/v kernel reads the
    NoPE layers' table of stride 0 as it reads a full one."""
    from tests.gpu.conftest import PlanDriver, hf_greedy, runner_for

    _, folder, hf_model = family
    prompt, num_new = [5, 17, 42, 99, 3, 250, 7, 8, 64, 12, 31], 3  # interpreter time
    driver = PlanDriver(runner_for(folder, backend="triton"), chunk=5)
    driver.add("r", prompt)
    driver.run(num_new)
    assert driver.seqs["r"].output == hf_greedy(hf_model, prompt, num_new)


@pytest.mark.parametrize("family", ["glm4"], indirect=True)
def test_lora_q_and_k_rows_follow_the_reordered_heads(
    family: tuple[str, Path, Any], tmp_path: Path
) -> None:
    """An adapter on q_proj and k_proj (its B rows reordered as the model's q/k, in
    gpu/lora_adapter.py) through the engine answers PEFT's greedy tokens."""
    import anyio
    from graph_helpers import collect
    from troupe import Engine, EngineConfig
    from troupe.messages import SamplingParams

    from tests.gpu.conftest import add_word_tokenizer, hf_greedy
    from tests.gpu.lora_reference import tokens_of
    from tests.lora.adapters import peft_adapter

    _, folder, hf_model = family
    add_word_tokenizer(folder)
    peft_model = peft_adapter(hf_model, tmp_path / "qk", targets=("q_proj", "k_proj"), scale=0.5)
    prompt, num_new = [5, 17, 42, 99, 3, 250, 7, 8, 64, 12, 31], 8
    expected = hf_greedy(peft_model, prompt, num_new)
    assert expected != hf_greedy(hf_model, prompt, num_new)  # the adapter changes the text
    config = EngineConfig(
        device="cpu", model=str(folder), dtype="float32", block_size=4, num_kv_blocks=64,
        max_num_seqs=2, max_model_len=128, lora_modules=(f"qk={tmp_path / 'qk'}",),
        max_lora_rank=8,
    )  # fmt: skip
    params = SamplingParams(max_tokens=num_new, temperature=0.0, ignore_eos=True, lora="qk")

    async def main() -> list[int]:
        async with Engine.open(config) as engine:
            return tokens_of(await collect(engine, prompt, params))

    assert anyio.run(main) == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(family: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*family[1:], device="cuda")


def test_yarn_defaults_as_transformers_reads_them() -> None:
    from troupe.gpu.rope_layers import rope_scaling

    cfg = {"max_position_embeddings": 128}
    got = rope_scaling({"rope_type": "yarn", "factor": 2.0, "rope_theta": 9.0}, cfg)
    assert got == {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128}
    derived = rope_scaling({"type": "yarn", "original_max_position_embeddings": 32}, cfg)
    assert derived is not None and derived["factor"] == 4.0
    assert rope_scaling({"rope_type": "default", "rope_theta": 9.0}, cfg) is None
    with pytest.raises(ValueError, match="needs original_max_position_embeddings"):
        rope_scaling({"rope_type": "yarn", "factor": 2.0}, {})


def test_exaone4_windows_from_its_letter_pattern() -> None:
    from troupe.gpu.hf_families import layer_windows
    from troupe.gpu.rope_layers import exaone4_fields

    cfg = {"sliding_window": 8, "sliding_window_pattern": "LLLG"}
    windows = layer_windows(cfg, "exaone4", 6)
    assert windows == (8, 8, 8, 0, 8, 8)
    assert exaone4_fields(windows)["nope_layers"] == (False,) * 3 + (True, False, False)
    assert layer_windows({**cfg, "sliding_window_pattern": 2}, "exaone4", 4) == (8, 0, 8, 0)
    assert exaone4_fields(()) == {"nope_layers": ()}  # no windows: every layer rotates
    with pytest.raises(ValueError, match="sliding_window_pattern 'LXG'"):
        layer_windows({**cfg, "sliding_window_pattern": "LXG"}, "exaone4", 3)


def test_config_json_errors_name_the_field() -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError

    base = {"model_type": "qwen3", "num_attention_heads": 4, "hidden_size": 64,
            "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 256}  # fmt: skip
    with pytest.raises(ModelLoadError, match="rope_scaling type 'alibi' is not supported"):
        ModelConfig.from_hf_dict({**base, "rope_scaling": {"rope_type": "alibi", "factor": 2}})
    dynamic = {**base, "rope_scaling": {"rope_type": "dynamic", "factor": 2}}  # default so far
    assert ModelConfig.from_hf_dict(dynamic).rope_scaling is None
    smol = {**base, "model_type": "smollm3"}
    with pytest.raises(ModelLoadError, match="no_rope_layers has 3 entries"):
        ModelConfig.from_hf_dict({**smol, "no_rope_layers": [1, 0, 1]})
    assert ModelConfig.from_hf_dict({**smol, "no_rope_layers": [1, 1]}).nope_layers == ()
    olmo = {**base, "model_type": "olmo3", "rope_parameters": {
        "sliding_attention": {**YARN, "rope_theta": 1e4}}}  # fmt: skip
    with pytest.raises(ModelLoadError, match="sliding_attention layers take no rope scaling"):
        ModelConfig.from_hf_dict(olmo)


def test_head_order_puts_each_rotated_pair_half_a_head_apart() -> None:
    from troupe.gpu.rope_layers import head_order

    assert head_order(8, 8, False) is None
    assert head_order(8, 4, False) == (0, 1, 4, 5, 2, 3, 6, 7)  # Phi-3: halves of 4 dims
    assert head_order(8, 4, True) == (0, 2, 4, 5, 1, 3, 6, 7)  # GLM-4: pairs (0, 1), (2, 3)
    assert head_order(4, 4, True) == (0, 2, 1, 3)  # ERNIE 4.5: the whole head in pairs


@pytest.mark.parametrize("family", ["glm4"], indirect=True)
def test_tensor_parallelism_is_refused_for_reordered_heads(family: tuple[str, Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError
    from troupe.gpu.tp_model import TPDecoderModel

    config = ModelConfig.from_hf_folder(family[1])
    with pytest.raises(ModelLoadError, match="partial or interleaved rotary: tensor parallelism"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 0)  # type: ignore[arg-type]
