"""The EAGLE-1 head on its own (CPU, fp32): its forward against a reference built from HF
transformers' decoder layer (fc, no input norm on layer 0, residual out, optional final
norm), the rows the engine feeds it (the token after each position and the target's own
final hidden state there, every position once, across prefill chunks and verifications),
and the loading errors, each naming the field and both sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import torch
from graph_helpers import collect, token_ids
from troupe import Engine, EngineConfig
from troupe.config import ConfigError
from troupe.gpu.device_inputs import device_metadata
from troupe.gpu.eagle_load import EagleModel, load_eagle
from troupe.gpu.eagle_runner import EagleRunner
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.step_inputs import StepInputs
from troupe.gpu.weights import load_model
from troupe.messages import SamplingParams

from tests.gpu.conftest import add_word_tokenizer, make_hf_model
from tests.gpu.eagle_heads import copy_head, random_head, save_head, target_tensors

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("eagle_head") / "target"
    hf_model = make_hf_model("qwen3", max_position_embeddings=128, num_hidden_layers=1)
    hf_model.save_pretrained(folder)
    add_word_tokenizer(folder)
    return folder, hf_model


def _config(target: Path, head: Path, **extra: Any) -> EngineConfig:
    return EngineConfig(
        model=str(target),
        device="cpu",
        dtype="float32",
        speculative_method="eagle",
        draft_model=str(head),
        **extra,
    )


def _load(target: Path, head: Path) -> EagleModel:
    config, model = load_model(target, torch.float32, CPU, 64)
    return load_eagle(_config(target, head), config, model, 64, 64)


def _chunk(start: int, ids: torch.Tensor) -> StepInputs:
    """One sequence's rows start .. start+n-1 over blocks 0, 1, 2, ... of 4 slots."""
    n = len(ids)
    positions = np.arange(start, start + n, dtype=np.int64)
    return StepInputs(
        input_ids=ids.numpy().astype(np.int64),
        positions=positions,
        slot_mapping=positions.copy(),
        block_tables=np.arange(8, dtype=np.int32)[None],
        seq_lens=np.array([start + n], np.int32),
        query_start_loc=np.array([0, n], np.int32),
        logits_indices=np.array([n - 1], np.int64),
        sampled_rows=np.array([0], np.int64),
        max_query_len=n,
        max_seq_len=start + n,
    )


def test_forward_matches_hf_reference(target: tuple[Path, Any], tmp_path: Path) -> None:
    folder, _ = target
    layer_source = make_hf_model("qwen3", max_position_embeddings=128, num_hidden_layers=1, seed=5)
    source = tmp_path / "source"
    layer_source.save_pretrained(source)
    weights = target_tensors(source)
    g = torch.Generator().manual_seed(7)
    tensors = {
        "fc.weight": torch.randn(64, 128, generator=g) * 0.2,
        "fc.bias": torch.randn(64, generator=g) * 0.2,
        "embed_tokens.weight": torch.randn(256, 64, generator=g),
        "norm.weight": weights["model.norm.weight"],
        "lm_head.weight": torch.zeros(256, 64),  # ignored: logits are the target's
    }
    for name, tensor in weights.items():
        if name.startswith("model.layers.0.") and "input_layernorm" not in name:
            tensors[name] = tensor  # under `model.`, as some checkpoints name them
    head = _load(folder, save_head(tmp_path / "head", source, tensors)).head
    assert head.fc_bias is not None and head.embed_tokens is not None and head.norm is not None
    kv = KVCache(head.config, num_gpu_blocks=8, num_cpu_blocks=0, block_size=4,
                 dtype=torch.float32, device=CPU)  # fmt: skip
    ids = torch.randint(0, 256, (9,), generator=g)
    hidden = torch.randn(9, 64, generator=g)

    def ours() -> torch.Tensor:  # a chunk of 5 rows, then 4 more reading the first's KV
        kv.gpu.zero_()
        parts = []
        for start, stop in ((0, 5), (5, 9)):
            inputs = _chunk(start, ids[start:stop])
            positions = torch.from_numpy(inputs.positions)
            meta = device_metadata(inputs, CPU)
            parts.append(head(ids[start:stop], positions, hidden[start:stop], meta, kv.layers))
        return torch.cat(parts)

    # the reference: HF's layer with its input norm taken out (vLLM's EAGLE-1 layer 0)
    layer_source.model.layers[0].input_layernorm = torch.nn.Identity()
    captured: list[torch.Tensor] = []
    hook = layer_source.model.layers[0].register_forward_hook(
        lambda _m, _i, out: captured.append(out[0] if isinstance(out, tuple) else out)
    )
    with torch.no_grad():
        fc_in = torch.cat([tensors["embed_tokens.weight"][ids], hidden], dim=-1)
        x = torch.nn.functional.linear(fc_in, tensors["fc.weight"], tensors["fc.bias"])
        normed = layer_source.model(inputs_embeds=x[None]).last_hidden_state[0]
    hook.remove()
    torch.testing.assert_close(ours(), normed, atol=2e-5, rtol=2e-5)
    head.norm = None  # without a final norm: the residual stream as the layer leaves it
    torch.testing.assert_close(ours(), captured[0].reshape(9, 64), atol=2e-5, rtol=2e-5)


def test_rows_fed_are_next_tokens_and_target_hidden_states(
    target: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, hf_model = target
    fed: list[tuple[np.ndarray, np.ndarray, torch.Tensor]] = []
    forward = EagleRunner._forward

    def spy(self: EagleRunner, inputs: StepInputs, hidden: torch.Tensor) -> torch.Tensor:
        fed.append((inputs.positions.copy(), inputs.input_ids.copy(), hidden.clone()))
        return forward(self, inputs, hidden)

    monkeypatch.setattr(EagleRunner, "_forward", spy)
    prompt = [(5 * j + 3) % 256 for j in range(19)]
    config = _config(
        folder,
        copy_head(tmp_path / "copy", folder),  # accepted often: verifications feed rows
        max_model_len=64,
        block_size=4,
        num_kv_blocks=32,
        max_num_batched_tokens=8,  # chunks of 8, 8, 3: rows wait for the next chunk
        num_speculative_tokens=3,
        speculative_min_acceptance=0.0,
        speculative_cost_model=False,
    )

    async def run() -> tuple[list[int], Any]:
        async with Engine.open(config) as engine:
            params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
            out = token_ids(await collect(engine, prompt, params))
            return out, engine.stats()

    output, stats = anyio.run(run)
    assert stats.num_spec_accepted_tokens > 0
    sequence = prompt + output
    with torch.no_grad():
        reference = hf_model.model(torch.tensor([sequence])).last_hidden_state[0]
    positions = np.concatenate([p for p, _, _ in fed])
    assert sorted(positions.tolist()) == list(range(len(sequence) - 1))  # each once
    tokens = np.concatenate([t for _, t, _ in fed])
    assert tokens.tolist() == [sequence[p + 1] for p in positions.tolist()]
    hidden = torch.cat([h for _, _, h in fed])
    torch.testing.assert_close(hidden, reference[torch.from_numpy(positions)], atol=1e-4, rtol=1e-4)


def test_loading_errors_name_the_field(target: tuple[Path, Any], tmp_path: Path) -> None:
    folder, _ = target
    weights = target_tensors(random_head(tmp_path / "good", folder))
    bad_fc = {**weights, "fc.weight": torch.zeros(64, 96)}
    with pytest.raises(ConfigError, match=r"'fc.weight' has shape \(64, 96\).*\(64, 128\)"):
        _load(folder, save_head(tmp_path / "fc", folder, bad_fc))
    narrow = save_head(tmp_path / "narrow", folder, weights, hidden_size=32)
    with pytest.raises(ConfigError, match="draft_model has hidden_size 32, the model has 64"):
        _load(folder, narrow)
    vocab = save_head(tmp_path / "vocab", folder, weights, vocab_size=128)
    with pytest.raises(ConfigError, match="128 tokens, the model has 256"):
        _load(folder, vocab)
    no_fc = {k: v for k, v in weights.items() if k != "fc.weight"}
    with pytest.raises(ConfigError, match=r"no tensor 'fc\.weight'"):
        _load(folder, save_head(tmp_path / "no_fc", folder, no_fc))
    with pytest.raises(ConfigError, match="not an EAGLE head's folder"):
        _load(folder, tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"needs draft_model \(an EAGLE head's HF folder\)"):
        EngineConfig(speculative_method="eagle")
    with pytest.raises(ConfigError, match="tensor_parallel_size must be 1"):
        _config(folder, tmp_path / "good", tensor_parallel_size=2)


def test_bin_checkpoint_loads_as_safetensors(target: tuple[Path, Any], tmp_path: Path) -> None:
    folder, _ = target
    good = random_head(tmp_path / "good", folder, fc_bias=True)
    as_bin = tmp_path / "bin"
    as_bin.mkdir()
    (as_bin / "config.json").write_bytes((good / "config.json").read_bytes())
    torch.save(target_tensors(good), as_bin / "pytorch_model.bin")
    first, second = _load(folder, good).head, _load(folder, as_bin).head
    assert first.fc_bias is not None and second.fc_bias is not None
    for (name, a), (_, b) in zip(
        first.state_dict().items(), second.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
