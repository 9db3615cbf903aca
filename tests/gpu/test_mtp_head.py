"""DeepSeek's MTP layer on its own (CPU, fp32): its forward and logits against a reference
built from HF transformers' DeepseekV3 decoder layer (eh_proj over enorm(embedding) and
hnorm(hidden), position 0's embedding masked, residual out, shared_head norm and head), the
rows the engine feeds it (the token after each position and the model's own post-norm
hidden state there, every position once, across prefill chunks and verifications), and the
loader's refusals, each naming the field or tensor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import torch
from graph_helpers import collect, token_ids
from safetensors.torch import save_file
from troupe import Engine, EngineConfig
from troupe.config import ConfigError
from troupe.gpu.device_inputs import device_metadata
from troupe.gpu.eagle_runner import EagleRunner
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.mtp_load import load_mtp
from troupe.gpu.mtp_model import MtpHead
from troupe.gpu.runner_setup import load_for_config
from troupe.gpu.step_inputs import StepInputs
from troupe.gpu.weights import load_model
from troupe.messages import SamplingParams

from tests.gpu.conftest import add_word_tokenizer, make_hf_model
from tests.gpu.mtp_checkpoints import bigram_copy, hf_config, save_model, tensors_of

CPU = torch.device("cpu")
MTP = "model.layers.2."  # the MTP layer of the two-layer models


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("mtp_head")
    return {"random": save_model(tmp / "random"), "copy": bigram_copy(tmp / "copy")}


def _load(folder: Path) -> Any:
    config, model = load_model(folder, torch.float32, CPU, 64)
    return load_mtp(folder, config, model, 64)


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


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def test_forward_and_logits_match_hf_reference(models: dict[str, Path], tmp_path: Path) -> None:
    import transformers

    folder = models["random"]
    mtp = _load(folder)
    head = mtp.head
    assert isinstance(head, MtpHead) and head.layer.experts is not None  # layer 2: experts
    assert head.shared_head is not None and head.embed_tokens is None  # own head, model's embed
    kv = KVCache(mtp.config, num_gpu_blocks=8, num_cpu_blocks=0, block_size=4,
                 dtype=torch.float32, device=CPU)  # fmt: skip
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 256, (9,), generator=g)
    hidden = torch.randn(9, 64, generator=g)

    def ours() -> tuple[torch.Tensor, torch.Tensor]:  # a chunk of 5 rows, then 4 reading it
        kv.gpu.zero_()
        outs = []
        for start, stop in ((0, 5), (5, 9)):
            inputs = _chunk(start, ids[start:stop])
            positions = torch.from_numpy(inputs.positions)
            meta = device_metadata(inputs, CPU)
            out, fed = head.run(ids[start:stop], positions, hidden[start:stop], meta, kv.layers)
            assert fed is out  # the next draft step reads the layer's own output
            outs.append(out)
        out = torch.cat(outs)
        return out, head.compute_logits(out)

    # the reference: HF's DeepSeek-V3 decoder layer (experts: first_k_dense_replace 0) fed
    # eh_proj's output, the model's norm as shared_head.norm, its lm_head as shared_head.head
    tensors = tensors_of(folder)
    state = {"model.norm.weight": tensors[MTP + "shared_head.norm.weight"],
             "lm_head.weight": tensors[MTP + "shared_head.head.weight"],
             "model.embed_tokens.weight": tensors["model.embed_tokens.weight"]}  # fmt: skip
    for name, tensor in tensors.items():
        if name.startswith(MTP) and not name.removeprefix(MTP).startswith(("e", "h", "shared")):
            state["model.layers.0." + name.removeprefix(MTP)] = tensor
    source = tmp_path / "reference"  # from_pretrained: per-expert names as transformers reads
    hf_config(num_hidden_layers=1, first_k_dense_replace=0).save_pretrained(source)
    save_file(state, str(source / "model.safetensors"))
    reference = transformers.DeepseekV3ForCausalLM.from_pretrained(source, dtype=torch.float32)
    reference.eval()
    captured: list[torch.Tensor] = []
    hook = reference.model.layers[0].register_forward_hook(
        lambda _m, _i, out: captured.append(out[0] if isinstance(out, tuple) else out)
    )
    with torch.no_grad():
        embed = tensors["model.embed_tokens.weight"][ids].clone()
        embed[0] = 0.0  # position 0: masked, as vLLM does
        e = _rms(embed, tensors[MTP + "enorm.weight"])
        h = _rms(hidden, tensors[MTP + "hnorm.weight"])
        x = torch.cat([e, h], dim=-1) @ tensors[MTP + "eh_proj.weight"].T
        logits = reference(inputs_embeds=x[None]).logits[0]
    hook.remove()
    out, our_logits = ours()
    torch.testing.assert_close(out, captured[0].reshape(9, 64), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(our_logits, logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["random", "copy"])
def test_rows_fed_are_next_tokens_and_post_norm_hidden_states(
    models: dict[str, Path], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    folder = models[name]
    fed: list[tuple[np.ndarray, np.ndarray, torch.Tensor]] = []
    forward = EagleRunner._forward

    def spy(self: EagleRunner, inputs: StepInputs, hidden: torch.Tensor) -> Any:
        fed.append((inputs.positions.copy(), inputs.input_ids.copy(), hidden.clone()))
        return forward(self, inputs, hidden)

    monkeypatch.setattr(EagleRunner, "_forward", spy)
    prompt = [(5 * j + 3) % 256 for j in range(19)]
    config = EngineConfig(
        model=str(folder),
        device="cpu",
        dtype="float32",
        speculative_method="mtp",
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
    if name == "copy":  # verifications with accepted proposals feed several rows
        assert stats.num_spec_accepted_tokens == stats.num_spec_proposed_tokens > 0
    sequence = prompt + output
    hf_model = transformers.DeepseekV3ForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():  # the model's output after its final norm
        reference = hf_model.eval().model(torch.tensor([sequence])).last_hidden_state[0]
    positions = np.concatenate([p for p, _, _ in fed])
    assert sorted(positions.tolist()) == list(range(len(sequence) - 1))  # each once
    tokens = np.concatenate([t for _, t, _ in fed])
    assert tokens.tolist() == [sequence[p + 1] for p in positions.tolist()]
    hidden = torch.cat([h for _, _, h in fed])
    torch.testing.assert_close(hidden, reference[torch.from_numpy(positions)], atol=1e-4, rtol=1e-4)


def test_copies_of_the_models_embedding_and_head_are_shared(models: dict[str, Path]) -> None:
    head = _load(models["copy"]).head
    assert isinstance(head, MtpHead)
    assert head.embed_tokens is None and head.shared_head is None  # no second copy


def test_loading_errors_name_the_field_or_tensor(models: dict[str, Path], tmp_path: Path) -> None:
    base = tensors_of(models["random"])

    def variant(name: str, edit: Any = None, **overrides: Any) -> Path:
        tensors = dict(base)
        if edit is not None:
            edit(tensors)
        return save_model(tmp_path / name, tensors, **overrides)

    with pytest.raises(ConfigError, match=r"no MTP tensor 'model\.layers\.2\.eh_proj\.weight'"):
        _load(variant("no_eh", lambda t: t.pop(MTP + "eh_proj.weight")))
    expert = MTP + "mlp.experts.5.down_proj.weight"
    with pytest.raises(ConfigError, match=rf"no MTP tensor '{expert}'".replace(".", r"\.")):
        _load(variant("no_expert", lambda t: t.pop(expert)))
    with pytest.raises(ConfigError, match=r"'model\.layers\.2\.eh_proj\.weight' has shape"
                       r" \(64, 64\), the MTP layer needs \(64, 128\)"):  # fmt: skip
        _load(variant("narrow", lambda t: t.update({MTP + "eh_proj.weight": torch.ones(64, 64)})))
    with pytest.raises(ConfigError, match="num_nextn_predict_layers 0; it needs >= 1"):
        _load(variant("zero", num_nextn_predict_layers=0))
    with pytest.raises(ConfigError, match="num_nextn_predict_layers 2; troupe runs one"):
        _load(variant("two", num_nextn_predict_layers=2))
    undeclared = variant("undeclared")
    raw = json.loads((undeclared / "config.json").read_text())
    del raw["num_nextn_predict_layers"]
    (undeclared / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="num_nextn_predict_layers None"):
        _load(undeclared)
    qwen = tmp_path / "qwen3"
    make_hf_model("qwen3", num_hidden_layers=1).save_pretrained(qwen)
    add_word_tokenizer(qwen)
    config = EngineConfig(model=str(qwen), device="cpu", speculative_method="mtp")
    with pytest.raises(ConfigError, match=r"DeepSeek-V3-style model .* model_type is 'qwen3'"):
        load_for_config(config)
    with pytest.raises(ConfigError, match="is not one"):
        load_mtp(tmp_path / "model.gguf", ModelConfig.from_hf_folder(qwen), None, 8)  # type: ignore[arg-type]


def test_fp8_layer_is_expanded_with_its_scales(models: dict[str, Path], tmp_path: Path) -> None:
    tensors = tensors_of(models["random"])
    expected: dict[str, torch.Tensor] = {}
    for name in [n for n in tensors if n.startswith(MTP) and tensors[n].dim() == 2]:
        weight = tensors[name]
        scale = weight.abs().amax() / 448.0  # one block: [1, 1] weight_scale_inv
        q = (weight / scale).to(torch.float8_e4m3fn)
        tensors[name] = q
        tensors[name + "_scale_inv"] = scale.reshape(1, 1)
        expected[name] = q.float() * scale
    folder = tmp_path / "fp8"
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    for file in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / file).write_bytes((models["random"] / file).read_bytes())
    head = _load(folder).head
    assert isinstance(head, MtpHead)
    torch.testing.assert_close(head.eh_proj, expected[MTP + "eh_proj.weight"])
    torch.testing.assert_close(head.layer.kv_b_proj, expected[MTP + "self_attn.kv_b_proj.weight"])
    assert head.shared_head is not None
    torch.testing.assert_close(head.shared_head, expected[MTP + "shared_head.head.weight"])


def test_engine_config_refusals_and_vllm_spelling(models: dict[str, Path]) -> None:
    model = str(models["random"])
    assert EngineConfig(model=model, speculative_method="deepseek_mtp").speculative_method == "mtp"
    with pytest.raises(ConfigError, match="tensor_parallel_size must be 1 with speculative_method"):
        EngineConfig(model=model, speculative_method="mtp", tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="draft_model must be unset with speculative_method"):
        EngineConfig(model=model, speculative_method="mtp", draft_model=model)
    with pytest.raises(ConfigError, match="needs runner='model'"):
        EngineConfig(speculative_method="mtp", runner="fake")


def test_sharded_checkpoint_opens_only_the_mtp_layers_files(
    models: dict[str, Path], tmp_path: Path
) -> None:
    from troupe.gpu.mtp_load import read_layer

    tensors = tensors_of(models["random"])
    mtp = {n: t for n, t in tensors.items() if n.startswith(MTP)}
    folder = tmp_path / "sharded"
    folder.mkdir()
    save_file(mtp, str(folder / "model-00002-of-00002.safetensors"))
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"not read")  # the model's
    weight_map = {n: "model-00001-of-00002.safetensors" for n in tensors if n not in mtp}
    weight_map.update({n: "model-00002-of-00002.safetensors" for n in mtp})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    layer = read_layer(folder, MTP)
    assert set(layer) == {n.removeprefix(MTP) for n in mtp}
    torch.testing.assert_close(layer["eh_proj.weight"], mtp[MTP + "eh_proj.weight"])
