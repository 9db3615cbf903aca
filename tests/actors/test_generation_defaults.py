"""The model's generation_config.json as the requests' sampling defaults (vLLM's
--generation-config / --override-generation-config): what read_sampling_defaults makes of a
folder, a GGUF file, "vllm" and a path; the override on top; the ConfigErrors that name the
field; the CLI flags; and the Engine showing what it read (a bad file stops its start, the
runner closed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from troupe import Engine, EngineConfig
from troupe.actors.generation_defaults import read_sampling_defaults
from troupe.config import ConfigError, default_model_path
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.runner_wrapper import RunnerWrapper
from troupe.messages.sampling_defaults import NO_DEFAULTS, SamplingDefaults
from troupe.ops.cli import build_parser, config_from_args

# Qwen3-8B's generation_config.json, as shipped
QWEN3 = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "transformers_version": "4.51.0",
}
QWEN3_DEFAULTS = SamplingDefaults(temperature=0.6, top_p=0.95, top_k=20)


def model_folder(folder: Path, generation_config: dict[str, Any] | None) -> Path:
    """A model folder of SmolLM2's tokenizer and chat template (the fake runner needs no
    weights) with `generation_config` as its generation_config.json (None: no such file)."""
    from troupe.actors.core.tokenizer_files import load_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    smol = load_tokenizer()
    smol.tokenizer.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "chat_template": smol.chat_template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if generation_config is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation_config))
    return folder


def _config(model: Path | None, **kw: Any) -> EngineConfig:
    return EngineConfig(runner="fake", model=None if model is None else str(model), **kw)


def test_auto_reads_the_model_folders_sampling_keys_only(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "qwen3", QWEN3)
    defaults = read_sampling_defaults(_config(folder))
    assert defaults == QWEN3_DEFAULTS
    assert defaults.as_kwargs() == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    every = {**QWEN3, "min_p": 0.05, "repetition_penalty": 1.05, "max_new_tokens": 512}
    (folder / "generation_config.json").write_text(json.dumps(every))
    assert read_sampling_defaults(_config(folder)) == SamplingDefaults(
        temperature=0.6, top_p=0.95, top_k=20, min_p=0.05, repetition_penalty=1.05, max_tokens=512
    )
    # null values, and a folder without the file, leave the neutral defaults
    (folder / "generation_config.json").write_text(json.dumps({"temperature": None}))
    assert read_sampling_defaults(_config(folder)) == NO_DEFAULTS
    assert read_sampling_defaults(_config(model_folder(tmp_path / "bare", None))) == NO_DEFAULTS


def test_vllm_mode_ignores_the_file_and_a_path_reads_another(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "qwen3", QWEN3)
    assert read_sampling_defaults(_config(folder, generation_config="vllm")) == NO_DEFAULTS
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"temperature": 0.2}))
    from_folder = read_sampling_defaults(_config(folder, generation_config=str(other)))
    assert from_folder == SamplingDefaults(temperature=0.2)
    as_file = _config(folder, generation_config=str(other / "generation_config.json"))
    assert read_sampling_defaults(as_file) == SamplingDefaults(temperature=0.2)
    with pytest.raises(ConfigError, match=r"^generation_config: .*absent.* is neither a folder"):
        read_sampling_defaults(_config(folder, generation_config=str(tmp_path / "absent")))


def test_the_override_wins_in_every_mode(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "qwen3", QWEN3)
    override = {"temperature": 0.5, "max_new_tokens": 64}
    got = read_sampling_defaults(_config(folder, override_generation_config=override))
    assert got == SamplingDefaults(temperature=0.5, top_p=0.95, top_k=20, max_tokens=64)
    vllm = _config(folder, generation_config="vllm", override_generation_config=override)
    assert read_sampling_defaults(vllm) == SamplingDefaults(temperature=0.5, max_tokens=64)
    # an override fixes a value of the file that SamplingParams refuses
    (folder / "generation_config.json").write_text(json.dumps({**QWEN3, "top_p": 0.0}))
    fixed = read_sampling_defaults(_config(folder, override_generation_config={"top_p": 0.9}))
    assert fixed == SamplingDefaults(temperature=0.6, top_p=0.9, top_k=20)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"temp": 0.5}, r"'temp' is not a sampling default; the keys are temperature, "),
        ({"max_tokens": 5}, r"'max_tokens' is not a sampling default"),  # HF's name only
        ({"temperature": -1}, r"temperature must be 0 \(greedy\) or in"),
        ({"top_p": 1.5}, r"top_p must be"),
        ({"top_k": 2.5}, r"top_k must be an integer, got 2\.5"),
        ({"top_k": -2}, r"top_k must be -1, 0 \(off\) or >= 1"),
        ({"repetition_penalty": "high"}, r"repetition_penalty must be a number, got 'high'"),
        ({"temperature": True}, r"temperature must be a number, got True"),
        ({"max_new_tokens": 0}, r"max_new_tokens must be >= 1"),
        ([("temperature", 0.5)], r"must be a JSON object"),
    ],
)
def test_a_bad_override_is_a_config_error_naming_it(override: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"^override_generation_config.*{message}"):
        EngineConfig(override_generation_config=override)


def test_bad_generation_config_values_are_config_errors_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^generation_config must be 'auto', 'vllm' or a"):
        EngineConfig(generation_config="")
    folder = model_folder(tmp_path / "m", {"temperature": -0.5})
    file = folder / "generation_config.json"
    with pytest.raises(ConfigError, match=rf"^generation_config: {file}: temperature must be"):
        read_sampling_defaults(_config(folder))
    file.write_text("{not json")
    with pytest.raises(ConfigError, match=rf"^generation_config: cannot read {file}"):
        read_sampling_defaults(_config(folder))


def _write_gguf(path: Path, **floats: float) -> None:
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in floats.items():
        name = f"general.sampling.{key}"
        if isinstance(value, int):
            writer.add_int32(name, value)
        else:
            writer.add_float32(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def test_a_gguf_files_sampling_keys_are_its_defaults(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    _write_gguf(model, temp=0.7, top_p=0.8, top_k=20, min_p=0.05, penalty_repeat=1.05)
    assert read_sampling_defaults(_config(model)) == SamplingDefaults(
        temperature=0.7, top_p=0.8, top_k=20, min_p=0.05, repetition_penalty=1.05
    )
    # the default model's GGUF carries none
    assert read_sampling_defaults(_config(None)) == NO_DEFAULTS
    assert default_model_path().suffix == ".gguf"


def test_the_cli_flags_mirror_the_fields() -> None:
    parser = build_parser()
    args = ["serve", "--generation-config", "vllm"]
    args += ["--override-generation-config", '{"temperature": 0.5, "top_k": 8}']
    config = config_from_args(parser.parse_args(args))
    assert config.generation_config == "vllm"
    assert config.override_generation_config == {"temperature": 0.5, "top_k": 8}
    assert config_from_args(parser.parse_args(["serve"])).generation_config == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--override-generation-config", "[1]"])


class _ClosedRecorder(RunnerWrapper):
    is_closed = False

    def close(self) -> None:
        self.is_closed = True
        self.inner.close()


@pytest.mark.anyio
async def test_the_engine_shows_what_it_read(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "qwen3", QWEN3)
    config = _config(folder, num_kv_blocks=64, gc_freeze=False)
    async with Engine.open(config) as engine:
        assert engine.sampling_defaults == QWEN3_DEFAULTS
    (folder / "generation_config.json").write_text(json.dumps({"top_k": "twenty"}))
    runner = _ClosedRecorder(FakeRunner.from_config(config))
    with pytest.raises(ConfigError, match=r"generation_config: .*top_k must be an integer"):
        async with Engine.open(config, runner=runner):
            pass
    assert runner.is_closed  # the start that failed gave its runner back
