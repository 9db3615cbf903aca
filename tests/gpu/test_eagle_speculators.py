"""EAGLE heads in the speculators format, and an EAGLE-3 head without lm_head.weight (CPU,
fp32): a speculators folder loads to the very head its plain layout loads to (EAGLE-3 and
EAGLE-1, vLLM's defaults for fields left out), num_speculative_tokens comes from its
speculators_config when the config sets none, the verifier is logged (a warning when it is
another architecture: vLLM does not refuse it either), a head without lm_head.weight computes
the model's logits; every refusal names the field or tensor and both sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import structlog
import torch
from troupe import EngineConfig
from troupe.config import ConfigError
from troupe.gpu.eagle3_model import Eagle3Head
from troupe.gpu.eagle_load import EagleModel, load_eagle
from troupe.gpu.eagle_shared_lm_head import Eagle3SharedHead
from troupe.gpu.weights import load_model

from tests.gpu.conftest import make_hf_model
from tests.gpu.eagle3_heads import random_head3
from tests.gpu.eagle_heads import random_head, save_head, target_tensors
from tests.gpu.eagle_speculators_heads import speculators_head1, speculators_head3

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("eagle_speculators")
    folders = {}
    for family in ("qwen2", "llama"):  # qwen2 ties its lm_head to the embedding, llama not
        hf_model = make_hf_model(family, max_position_embeddings=128, num_hidden_layers=3)
        hf_model.save_pretrained(tmp / family)
        folders[family] = tmp / family
    return folders


def _load(target: Path, head: Path, method: str = "eagle3", **extra: Any) -> EagleModel:
    config = EngineConfig(
        model=str(target), device="cpu", dtype="float32", speculative_method=method,  # type: ignore[arg-type]
        draft_model=str(head), **extra,
    )  # fmt: skip
    model_config, model = load_model(target, torch.float32, CPU, 64)
    return load_eagle(config, model_config, model, 64, 64)


def _same_head(a: EagleModel, b: EagleModel) -> None:
    assert a.config == b.config
    assert a.target_hidden.taps == b.target_hidden.taps
    ours, theirs = dict(a.head.named_parameters()), dict(b.head.named_parameters())  # type: ignore[attr-defined]
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name
    buffers = dict(b.head.named_buffers())  # type: ignore[attr-defined]
    for name, buffer in a.head.named_buffers():  # type: ignore[attr-defined]
        assert torch.equal(buffer, buffers[name]), name


def test_speculators_layout_loads_the_plain_head(targets: dict[str, Path], tmp_path: Path) -> None:
    target = targets["qwen2"]
    for i, plain in enumerate(
        [
            random_head3(tmp_path / "vocab", target, draft_vocab=96, norm_before_residual=True),
            random_head3(
                tmp_path / "wide",
                target,
                hidden_size=96,
                embed=True,
                eagle_aux_hidden_state_layer_ids=[3, 0, 2],
                norm_before_residual=False,
            ),
        ]
    ):
        loaded = _load(target, speculators_head3(tmp_path / f"spec{i}", plain))
        assert isinstance(loaded.head, Eagle3Head)
        _same_head(loaded, _load(target, plain))
    assert loaded.target_hidden.taps.layer_ids == (0, 2, 3)
    assert loaded.head.norm_before_residual is False and loaded.config.hidden_size == 96
    # a field left out takes vLLM's default for this format: norm_before_residual true
    plain = random_head3(tmp_path / "nbr", target, norm_before_residual=True)
    omitted = speculators_head3(tmp_path / "omitted", plain, norm_before_residual=None)
    assert "norm_before_residual" not in json.loads((omitted / "config.json").read_text())
    _same_head(_load(target, omitted), _load(target, plain))
    head = _load(target, omitted, method="eagle").head  # "eagle" finds an EAGLE-3 head
    assert isinstance(head, Eagle3Head) and head.norm_before_residual is True
    # EAGLE-1: fusion_fc (with fusion_bias) and transformer.* are fc and layers.0
    eagle1 = random_head(tmp_path / "eagle1", target, fc_bias=True)
    spec1 = speculators_head1(tmp_path / "spec1", eagle1)
    _same_head(_load(target, spec1, method="eagle"), _load(target, eagle1, method="eagle"))
    assert dict(_load(target, spec1, method="eagle").head.named_parameters())["fc_bias"].any()  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="is not an EAGLE-3 head \\(its speculators_model_type "
                       "is 'eagle'\\): speculative_method 'eagle3' needs one"):  # fmt: skip
        _load(target, spec1)


def test_num_speculative_tokens_from_the_head(targets: dict[str, Path], tmp_path: Path) -> None:
    plain = random_head3(tmp_path / "plain", targets["qwen2"])

    def k(head: Path, **extra: Any) -> int | None:
        settings = {"speculative_method": "eagle3", "draft_model": str(head), **extra}
        return EngineConfig(**settings).num_speculative_tokens  # type: ignore[arg-type]

    assert k(speculators_head3(tmp_path / "k2", plain, k=2)) == 2  # vLLM's default: the head's
    assert k(tmp_path / "k2", num_speculative_tokens=5) == 5  # the config's wins
    assert k(tmp_path / "k2", speculative_method="eagle") == 2
    assert (
        EngineConfig(speculative_method="eagle", draft_model=str(tmp_path / "k2")).num_proposals
        == 2
    )
    assert k(speculators_head3(tmp_path / "none", plain, k=None)) == 4  # no count: 4
    assert k(plain) == 4 and k(tmp_path / "missing") == 4  # not this format: 4
    assert (
        EngineConfig(
            speculative_method="draft_model", draft_model=str(tmp_path / "k2")
        ).num_proposals
        == 4
    )
    with pytest.raises(ConfigError, match=r"speculative_tokens is 20, more than the 16 a step "
                       "verifies; set num_speculative_tokens"):  # fmt: skip
        k(speculators_head3(tmp_path / "k20", plain, k=20))
    assert k(tmp_path / "k20", num_speculative_tokens=16) == 16
    with pytest.raises(ConfigError, match=r"proposal_methods\[0\]\.speculative_tokens must be an "
                       "integer >= 1, got 'x'"):  # fmt: skip
        k(speculators_head3(tmp_path / "kx", plain, k="x"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="num_speculative_tokens must be <= 16, got 17"):
        k(plain, num_speculative_tokens=17)


def test_verifier_is_logged_never_refused(targets: dict[str, Path], tmp_path: Path) -> None:
    plain = random_head3(tmp_path / "plain", targets["qwen2"])
    same = speculators_head3(tmp_path / "same", plain)  # Qwen2ForCausalLM, the model's
    other = speculators_head3(tmp_path / "other", plain, architectures=("LlamaForCausalLM",))
    with structlog.testing.capture_logs() as logs:
        _load(targets["qwen2"], same)
        _load(targets["qwen2"], other)
    said = [(e["event"], e["log_level"], e.get("verifier_architectures")) for e in logs
            if e["event"].startswith("eagle_head_verifier")]  # fmt: skip
    assert said == [
        ("eagle_head_verifier", "info", ["Qwen2ForCausalLM"]),
        ("eagle_head_verifier_differs", "warning", ["LlamaForCausalLM"]),
    ]


def test_refusals_name_the_field(targets: dict[str, Path], tmp_path: Path) -> None:
    target = targets["qwen2"]
    plain = random_head3(tmp_path / "plain", target, draft_vocab=96)
    layer = json.loads((plain / "config.json").read_text())
    cases: list[tuple[Path, str]] = [
        (speculators_head3(tmp_path / "mtp", plain, speculators_model_type="dflash"),
         "speculators_model_type 'dflash'; troupe loads 'eagle' and 'eagle3' heads"),
        (speculators_head3(tmp_path / "nolayer", plain, transformer_layer_config=None),
         "speculators_model_type 'eagle3' needs transformer_layer_config"),
        (speculators_head3(tmp_path / "nokey", plain, transformer_layer_config={
            k: v for k, v in layer.items() if k != "num_attention_heads"}),
         "transformer_layer_config has no 'num_attention_heads'"),
        (speculators_head3(tmp_path / "fcnorm", plain, norm_before_fc=True),
         "norm_before_fc true"),
        (speculators_head3(tmp_path / "vocab", plain, draft_vocab_size=300),
         "draft_vocab_size 300, the model has 256 tokens"),
        (speculators_head1(tmp_path / "hass", random_head(tmp_path / "e1", target),
                           layernorms=True),
         "layernorms true"),
    ]  # fmt: skip
    for path, message in cases:
        with pytest.raises(ConfigError, match=message):
            _load(target, path, method="eagle")
    weights = target_tensors(plain)
    cfg = {k: layer[k] for k in ("draft_vocab_size", "architectures")}
    biased = save_head(tmp_path / "bias", target, {**weights, "fc.bias": torch.zeros(64)}, **cfg)
    with pytest.raises(ConfigError, match=r"'fc\.bias': an EAGLE-3 head's fc has no bias"):
        _load(target, biased)


def test_without_lm_head_the_model_makes_the_logits(
    targets: dict[str, Path], tmp_path: Path
) -> None:
    drop = ("lm_head.weight",)
    for family, table in (("qwen2", "model.embed_tokens.weight"), ("llama", "lm_head.weight")):
        target = targets[family]
        full = random_head3(tmp_path / family, target)  # the model's vocabulary, no d2t
        weights = {k: v for k, v in target_tensors(full).items() if k not in drop}
        cfg = json.loads((full / "config.json").read_text())
        extra = {k: cfg[k] for k in ("draft_vocab_size", "architectures")}
        with_own = _load(target, full)
        for head_folder in (
            save_head(tmp_path / f"{family}_plain", target, weights, **extra),
            speculators_head3(tmp_path / f"{family}_spec", full, drop=drop),
        ):
            head = _load(target, head_folder).head
            assert isinstance(head, Eagle3SharedHead) and tuple(head.lm_head.shape) == (0, 64)
            hidden = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
            expected = hidden @ target_tensors(target)[table].T  # the model's rows
            torch.testing.assert_close(head.compute_logits(hidden), expected)
            theirs = dict(with_own.head.named_parameters())  # type: ignore[attr-defined]
            for name, tensor in head.named_parameters():  # all else is the head's own
                assert name == "lm_head" or torch.equal(tensor, theirs[name]), name
    target = targets["qwen2"]
    small = random_head3(tmp_path / "small", target, draft_vocab=96)
    narrow = random_head3(tmp_path / "narrow", target, hidden_size=32, embed=True)
    for path, message in [
        (speculators_head3(tmp_path / "s_small", small, drop=drop),
         r"ships no 'lm_head.weight', so the model's lm_head makes its logits \(as vLLM's\): its "
         r"draft_vocab_size 96 must be the model's vocab_size 256"),
        (speculators_head3(tmp_path / "s_narrow", narrow, drop=drop),
         "its hidden_size 32 must be the model's hidden_size 64"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            _load(target, path)
    moved = {k: v for k, v in target_tensors(tmp_path / "qwen2").items() if k not in drop}
    moved["d2t"] = torch.ones(256, dtype=torch.int64).index_fill_(0, torch.tensor([255]), -255)
    cfg = json.loads(((tmp_path / "qwen2") / "config.json").read_text())
    extra = {k: cfg[k] for k in ("draft_vocab_size", "architectures")}
    with pytest.raises(ConfigError, match=r"its 'd2t' must map every draft id to itself"):
        _load(target, save_head(tmp_path / "moved", target, moved, **extra))
