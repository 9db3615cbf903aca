"""EngineConfig.hf_overrides (vLLM's --hf-overrides; gpu/hf_overrides.py): YaRN switched on for
a Qwen3 checkpoint that ships without it answers transformers' greedy tokens for the config with
the override written in, through the whole engine (and at two tensor-parallel ranks); the
yarn scaling lifts the max_model_len limit as vLLM derives it; a GGUF model refuses overrides by
name; nested model configs merge key by key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from graph_helpers import collect
from troupe import Engine, EngineConfig, SamplingParams
from troupe.config import ConfigError
from troupe.gpu.hf_overrides import apply_hf_overrides

from tests.gpu.conftest import add_word_tokenizer, hf_greedy
from tests.gpu.family_checks import PROMPTS, TINY, saved_family
from tests.gpu.lora_reference import tokens_of

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
SETTINGS = {**TINY, "head_dim": 32, "rope_theta": 500.0, "max_position_embeddings": 64}
NUM_NEW = 24  # past the original 16 positions: the interpolated frequencies matter


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 without rope scaling, and a word tokenizer for the engine."""
    path = tmp_path_factory.mktemp("qwen3")
    saved_family(path, "Qwen3", SETTINGS)
    add_word_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def expected(folder: Path) -> list[list[int]]:
    """transformers' greedy tokens with YaRN written into the config (the same weights)."""
    import transformers

    config = transformers.Qwen3Config(
        **{**SETTINGS, "rope_parameters": {**YARN, "rope_theta": 500.0}}
    )
    model = transformers.Qwen3ForCausalLM.from_pretrained(folder, config=config).eval()
    plain = transformers.Qwen3ForCausalLM.from_pretrained(folder).eval()
    want = [hf_greedy(model, p, NUM_NEW) for p in PROMPTS]
    assert want != [hf_greedy(plain, p, NUM_NEW) for p in PROMPTS]  # the override matters
    return want


def run_engine(config: EngineConfig) -> list[list[int]]:
    params = SamplingParams(max_tokens=NUM_NEW, temperature=0.0, ignore_eos=True)

    async def main() -> list[list[int]]:
        async with Engine.open(config) as engine:
            return [tokens_of(await collect(engine, p, params)) for p in PROMPTS]

    return anyio.run(main)


def engine_config(folder: Path, **overrides: Any) -> EngineConfig:
    return EngineConfig(
        device="cpu", model=str(folder), dtype="float32", block_size=4, num_kv_blocks=64,
        max_num_seqs=2, hf_overrides={"rope_scaling": YARN}, **overrides,
    )  # fmt: skip


def test_yarn_switched_on_matches_transformers(folder: Path, expected: list[list[int]]) -> None:
    assert run_engine(engine_config(folder)) == expected


@pytest.mark.slow
def test_tensor_parallel_ranks_read_the_override(folder: Path, expected: list[list[int]]) -> None:
    assert run_engine(engine_config(folder, tensor_parallel_size=2)) == expected


def test_yarn_lifts_the_max_model_len_limit(folder: Path) -> None:
    from troupe.gpu.runner_setup import checked_max_model_len
    from troupe.gpu.weights import read_config

    scaled = read_config(folder, {"rope_scaling": YARN, "max_position_embeddings": 32})
    assert checked_max_model_len(engine_config(folder, max_model_len=64), scaled) == 64  # 16 x 4
    with pytest.raises(ConfigError, match=r"max_model_len 65 exceeds .* 32 \(yarn's 64\)"):
        checked_max_model_len(engine_config(folder, max_model_len=65), scaled)
    plain = read_config(folder, {"max_position_embeddings": 32})
    with pytest.raises(ConfigError, match="max_model_len 33 exceeds the model's max_position_"):
        checked_max_model_len(engine_config(folder, max_model_len=33), plain)


def test_a_gguf_model_refuses_overrides_by_name() -> None:
    from troupe.config import default_model_path
    from troupe.gpu.weights import read_config

    with pytest.raises(ConfigError, match="hf_overrides replaces keys of an HF folder's"):
        read_config(default_model_path(), {"rope_theta": 1.0})
    assert read_config(default_model_path(), {}).model_type == "llama"  # empty: nothing to do


def test_values_replace_and_nested_configs_merge() -> None:
    cfg = {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "text_config": {"a": 1, "b": 2}}
    got = apply_hf_overrides(cfg, {"rope_scaling": YARN, "text_config": {"b": 3}, "new": 4})
    assert got == {"rope_scaling": YARN, "text_config": {"a": 1, "b": 3}, "new": 4}
    assert cfg["text_config"] == {"a": 1, "b": 2}  # the caller's dict is left as it is
    assert apply_hf_overrides(cfg, None) is cfg
    with pytest.raises(ConfigError, match="hf_overrides must be a JSON object"):
        apply_hf_overrides(cfg, ["rope_scaling"])  # type: ignore[arg-type]


def test_the_cli_flag_takes_json() -> None:
    from troupe.ops.cli import build_parser, config_from_args

    flag = ["serve", "--hf-overrides", '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}']
    config = config_from_args(build_parser().parse_args(flag))
    assert config.hf_overrides == {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
