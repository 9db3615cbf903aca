"""The EAGLE-3 head on its own (CPU, fp32): its forward and logits against a plain-torch
reference written here (fc over the taps, layer 0 over cat(norm(embed), hidden_norm(h)),
the residual from h or from hidden_norm(h), its norm, its lm_head placed by d2t), the rows
the engine feeds it (the token after each position and the target's residual stream entering
the tapped layers there, every position once), and the loading errors by field and size."""

from __future__ import annotations

import json
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
from troupe.gpu.eagle3_model import Eagle3Head
from troupe.gpu.eagle_load import EagleModel, load_eagle
from troupe.gpu.eagle_runner import EagleRunner
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.step_inputs import StepInputs
from troupe.gpu.weights import load_model
from troupe.messages import SamplingParams

from tests.gpu.conftest import add_word_tokenizer, make_hf_model
from tests.gpu.eagle3_heads import draft_ids, random_head3
from tests.gpu.eagle_heads import random_head, save_head, target_tensors
from tests.gpu.test_eagle_head import _chunk

CPU = torch.device("cpu")
F = torch.nn.functional


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("eagle3_head") / "target"
    hf_model = make_hf_model("qwen2", max_position_embeddings=128, num_hidden_layers=3)
    hf_model.save_pretrained(folder)
    add_word_tokenizer(folder)
    return folder, hf_model


def _config(target: Path, head: Path, **extra: Any) -> EngineConfig:
    settings = {"speculative_method": "eagle3", "draft_model": str(head), **extra}
    return EngineConfig(model=str(target), device="cpu", dtype="float32", **settings)


def _load(target: Path, head: Path, method: str = "eagle3") -> EagleModel:
    config, model = load_model(target, torch.float32, CPU, 64)
    return load_eagle(_config(target, head, speculative_method=method), config, model, 64, 64)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary on [N, heads, D]."""
    half = x.shape[-1] // 2
    angles = positions[:, None].double() * theta ** (-torch.arange(half).double() / half)
    cos, sin = angles.cos().float()[:, None], angles.sin().float()[:, None]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _reference(
    t: dict[str, torch.Tensor],
    cfg: dict[str, Any],
    ids: torch.Tensor,
    taps: torch.Tensor,
    norm_before_residual: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(normed, prenorm, logits) of one sequence's rows at positions 0 .. N-1."""
    eps, heads, kv_heads = (
        cfg["rms_norm_eps"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
    )
    n, d = len(ids), cfg.get("head_dim") or cfg["hidden_size"] // heads
    hidden = taps @ t["fc.weight"].T
    normed_hidden = _rms(hidden, t["midlayer.hidden_norm.weight"], eps)
    x = torch.cat(
        [_rms(t["embed"][ids], t["midlayer.input_layernorm.weight"], eps), normed_hidden], -1
    )
    positions = torch.arange(n)

    def proj(name: str, count: int) -> torch.Tensor:
        w, b = (
            t[f"midlayer.self_attn.{name}_proj.weight"],
            t[f"midlayer.self_attn.{name}_proj.bias"],
        )
        return (x @ w.T + b).view(n, count, d)

    q = _rope(proj("q", heads), positions, cfg["rope_theta"])
    k = _rope(proj("k", kv_heads), positions, cfg["rope_theta"])
    v = proj("v", kv_heads)
    k, v = (z.repeat_interleave(heads // kv_heads, dim=1) for z in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) * d**-0.5
    scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, heads * d)
    residual = (normed_hidden if norm_before_residual else hidden) + attn @ t[
        "midlayer.self_attn.o_proj.weight"
    ].T
    y = _rms(residual, t["midlayer.post_attention_layernorm.weight"], eps)
    mlp = F.silu(y @ t["midlayer.mlp.gate_proj.weight"].T) * (
        y @ t["midlayer.mlp.up_proj.weight"].T
    )
    prenorm = residual + mlp @ t["midlayer.mlp.down_proj.weight"].T
    normed = _rms(prenorm, t["norm.weight"], eps)
    logits = torch.full((n, cfg["vocab_size"]), float("-inf"))
    logits[:, torch.arange(len(t["d2t"])) + t["d2t"]] = normed @ t["lm_head.weight"].T
    return normed, prenorm, logits


@pytest.mark.parametrize("width", [None, 96, 32])  # the model's; a wider and a narrower head
def test_forward_and_logits_match_reference(
    target: tuple[Path, Any], tmp_path: Path, width: int | None
) -> None:
    folder, _ = target
    head_folder = random_head3(
        tmp_path / "head", folder, draft_vocab=96, hidden_size=width, embed=width is not None
    )
    tensors = target_tensors(head_folder)
    shared = target_tensors(folder)["model.embed_tokens.weight"]
    tensors["embed"] = tensors["embed_tokens.weight"] if width else shared
    cfg = json.loads((head_folder / "config.json").read_text())
    loaded = _load(folder, head_folder)
    head = loaded.head
    assert isinstance(head, Eagle3Head) and head.config.rope_scaling is None
    h = width or 64
    assert head.config.hidden_size == cfg["hidden_size"] == h
    assert tuple(head.fc.shape) == (h, 3 * 64)  # fc reads the model's states, 64 wide
    assert tuple(loaded.target_hidden.buffer.shape[1:]) == (3 * 64,)
    cfg["rope_theta"] = head.config.rope_theta  # newer transformers nest it in rope_parameters
    kv = KVCache(head.config, num_gpu_blocks=8, num_cpu_blocks=0, block_size=4,
                 dtype=torch.float32, device=CPU)  # fmt: skip
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 256, (9,), generator=g)
    taps = torch.randn(9, 3 * 64, generator=g)

    def ours() -> tuple[torch.Tensor, torch.Tensor]:  # a chunk of 5 rows, then 4 more
        kv.gpu.zero_()
        parts = []
        for start, stop in ((0, 5), (5, 9)):
            inputs: StepInputs = _chunk(start, ids[start:stop])
            positions = torch.from_numpy(inputs.positions)
            meta = device_metadata(inputs, CPU)
            hidden = head.combine(taps[start:stop])
            parts.append(head.run(ids[start:stop], positions, hidden, meta, kv.layers))
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    for norm_before_residual in (False, True):
        head.norm_before_residual = norm_before_residual
        normed, prenorm, logits = _reference(tensors, cfg, ids, taps, norm_before_residual)
        got_normed, got_prenorm = ours()
        # fp32 sums in another order (the 96-wide head): one element in 864 lands 2.6e-5 off
        torch.testing.assert_close(got_prenorm, prenorm, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got_normed, normed, atol=1e-4, rtol=1e-4)
        got_logits = head.compute_logits(got_normed)
        assert torch.equal(torch.isinf(got_logits), torch.isinf(logits))
        assert torch.isfinite(got_logits).sum(-1).tolist() == [96] * 9
        # and few fp32 rows take weight @ x^T (quant_linear.linear): 2.9e-5 off at worst
        torch.testing.assert_close(got_logits, logits, atol=5e-5, rtol=5e-5)


def test_rows_fed_are_next_tokens_and_tapped_layers(
    target: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, hf_model = target
    fed: list[tuple[np.ndarray, np.ndarray, torch.Tensor]] = []
    forward = EagleRunner._forward

    def spy(self: EagleRunner, inputs: StepInputs, taps: torch.Tensor) -> Any:
        fed.append((inputs.positions.copy(), inputs.input_ids.copy(), taps.clone()))
        return forward(self, inputs, taps)

    monkeypatch.setattr(EagleRunner, "_forward", spy)
    prompt = [(5 * j + 3) % 256 for j in range(19)]
    head = random_head3(
        tmp_path / "head", folder, eagle_aux_hidden_state_layer_ids=[3, 0, 2]
    )  # 3: after the last layer, before the final norm; read in ascending order
    config = _config(
        folder,
        head,
        max_model_len=64,
        block_size=4,
        num_kv_blocks=32,
        max_num_batched_tokens=8,  # chunks of 8, 8, 3: rows wait for the next chunk
        num_speculative_tokens=3,
        speculative_min_acceptance=0.0,
        speculative_cost_model=False,
    )

    async def run() -> list[int]:
        async with Engine.open(config) as engine:
            params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
            return token_ids(await collect(engine, prompt, params))

    sequence = prompt + anyio.run(run)
    last: list[torch.Tensor] = []
    hook = hf_model.model.layers[-1].register_forward_hook(
        lambda _m, _i, out: last.append(out[0] if isinstance(out, tuple) else out)
    )
    with torch.no_grad():
        states = hf_model.model(torch.tensor([sequence]), output_hidden_states=True).hidden_states
    hook.remove()
    # HF's hidden_states[j] is the residual stream entering layer j (its last is post-norm)
    reference = torch.cat([states[0][0], states[2][0], last[0].reshape(len(sequence), 64)], -1)
    positions = np.concatenate([p for p, _, _ in fed])
    assert sorted(positions.tolist()) == list(range(len(sequence) - 1))  # each once
    tokens = np.concatenate([t for _, t, _ in fed])
    assert tokens.tolist() == [sequence[p + 1] for p in positions.tolist()]
    taps = torch.cat([h for _, _, h in fed])
    torch.testing.assert_close(taps, reference[torch.from_numpy(positions)], atol=1e-4, rtol=1e-4)


def test_loading_errors_name_the_field(target: tuple[Path, Any], tmp_path: Path) -> None:
    folder, _ = target
    good = random_head3(tmp_path / "good", folder, draft_vocab=96)
    weights = target_tensors(good)
    cfg = json.loads((good / "config.json").read_text())
    extra = {k: cfg[k] for k in ("draft_vocab_size", "architectures")}

    def head(name: str, tensors: dict[str, torch.Tensor], **config: Any) -> Path:
        return save_head(tmp_path / name, folder, tensors, **{**extra, **config})

    narrow_head = random_head3(
        tmp_path / "narrow", folder, draft_vocab=96, hidden_size=32, embed=True
    )
    narrow = target_tensors(narrow_head)
    shared = {k: v for k, v in narrow.items() if k != "embed_tokens.weight"}
    width = {"hidden_size": 32, "intermediate_size": 64}  # a head 32 wide on the model's 64
    cases: list[tuple[Path, str]] = [
        (head("fc", {**weights, "fc.weight": torch.zeros(64, 128)}),
         r"'fc.weight' has shape \(64, 128\) \(it reads 2 states of 64\), the head needs "
         r"\(64, 192\): hidden_size 64 from the 3 tapped layers \(0, 1, 2\) "
         r"\(eagle_aux_hidden_state_layer_ids\) of target_hidden_size 64"),
        (head("fc_rows", {**weights, "fc.weight": torch.zeros(32, 192)}),
         r"'fc.weight' has shape \(32, 192\) \(it reads 3 states of 64\), the head needs "
         r"\(64, 192\): hidden_size 64"),
        (head("untold", narrow, **width),  # no target_hidden_size: fc would read 32-wide states
         r"config.json: hidden_size 32 and no target_hidden_size, the model has hidden_size 64"),
        (head("narrow_fc", {**narrow, "fc.weight": torch.zeros(32, 96)}, **width,
              target_hidden_size=64),  # fc sized from hidden_size, not target_hidden_size
         r"'fc.weight' has shape \(32, 96\) \(it reads 1.5 states of 64\), the head needs "
         r"\(32, 192\): hidden_size 32 .* of target_hidden_size 64"),
        (head("shared_embed", shared, **width, target_hidden_size=64),
         r"ships no 'embed_tokens.weight': the model's embedding is 64 wide \(target_hidden_size "
         r"64\), the head's hidden_size is 32"),
        (head("embed_width", {**narrow, "embed_tokens.weight": torch.zeros(256, 64)}, **width,
              target_hidden_size=64),
         r"'embed_tokens.weight' has shape \(256, 64\), the model needs \(256, 32\) "
         r"\(hidden_size 32\)"),
        (head("narrow_wide_t", narrow, **width, target_hidden_size=32),
         "target_hidden_size 32, the model has hidden_size 64"),
        (head("d2t_shape", {**weights, "d2t": torch.zeros(95, dtype=torch.int64)}),
         r"'d2t' has shape \(95,\).*needs \(96,\) integers"),
        (head("d2t_range", {**weights, "d2t": weights["d2t"] + 200}),
         "'d2t' maps draft ids outside the model's 256 tokens"),
        (head("t2d", {**weights, "t2d": torch.ones(256, dtype=torch.bool)}),
         r"'t2d' \(shape \(256,\), 256 set\) disagrees with 'd2t' \(96 draft ids"),
        (head("no_lm_head", {k: v for k, v in weights.items() if k != "lm_head.weight"}),
         r"ships no 'lm_head.weight', so the model's lm_head .* draft_vocab_size 96 must be "
         r"the model's vocab_size 256"),  # without: the model's (tests/gpu/test_eagle_speculators.py)
        (head("no_hidden_norm", {k: v for k, v in weights.items() if "hidden_norm" not in k}),
         r"no tensor 'layers\.0\.hidden_norm\.weight'"),
        (head("lm_head", {**weights, "lm_head.weight": torch.zeros(95, 64)}),
         r"'lm_head.weight' has shape \(95, 64\), the model needs \(96, 64\)"),
        (head("vocab", weights, draft_vocab_size=300),
         "draft_vocab_size 300, the model has 256 tokens"),
        (head("layers", weights, eagle_aux_hidden_state_layer_ids=[0, 2, 7]),
         r"eagle_aux_hidden_state_layer_ids \[0, 2, 7\] name layer 7; the model has 3 layers"),
        (head("width", weights, target_hidden_size=32),
         "target_hidden_size 32, the model has hidden_size 64"),
    ]  # fmt: skip
    for path, message in cases:
        with pytest.raises(ConfigError, match=message):
            _load(folder, path)
    loaded = _load(folder, head("narrow_good", narrow, **width, target_hidden_size=64))
    assert loaded.config.hidden_size == 32 and loaded.target_hidden.hidden_size == 64
    eagle1 = random_head(tmp_path / "eagle1", folder)
    with pytest.raises(ConfigError, match=r"is not an EAGLE-3 head .*'eagle3' needs one"):
        _load(folder, eagle1)
    assert _load(folder, eagle1, method="eagle").target_hidden.taps.layer_ids == ()
    loaded = _load(folder, good, method="eagle")  # found by its folder
    assert loaded.target_hidden.taps.layer_ids == (0, 1, 2)  # vLLM's (2, 3 // 2, 3 - 3)
    assert isinstance(loaded.head, Eagle3Head)
    mapping = loaded.head.get_buffer("draft_to_target")
    assert torch.equal(mapping, draft_ids(256, 96, seed=3))
    with pytest.raises(ConfigError, match=r"needs draft_model \(an EAGLE head's HF folder\)"):
        EngineConfig(speculative_method="eagle3")
