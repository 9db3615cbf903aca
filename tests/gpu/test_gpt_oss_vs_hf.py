"""GPT-OSS (attention with q/k/v/o biases and learned sinks, every other layer windowed from
layer 0, YaRN rotary; biased experts with a clamped SwiGLU behind a biased top-k router) is
greedy token-identical to HF transformers (fp32) through chunked prefill: on the torch ops, on
the Triton ops (the interpreter here), on CUDA, and from an MXFP4 checkpoint as OpenAI ships
them, against transformers' own dequantization. The sinks, the clamp and the window each change
the test model's logits, so the greedy tests check them. Two pipeline stages serve it too;
tensor parallelism is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from troupe.config import Quantization

from tests.gpu.conftest import PlanDriver, hf_greedy, runner_for
from tests.gpu.family_checks import NUM_NEW, PROMPTS, TINY, assert_greedy_matches

# 4 experts, 2 a token; a limit of 1 clamps many gate and up values of these weights; a window
# of 4 on layer 0 hides most of each prompt from it
TINY_GPT_OSS = {
    **TINY,
    "head_dim": 16,
    "intermediate_size": 32,  # MXFP4 groups 32 inputs: down_proj's rows are one group
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "sliding_window": 4,
    "swiglu_limit": 1.0,
    "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
        "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64,
    },
}  # fmt: skip


def _hf_model() -> Any:
    import transformers

    torch.manual_seed(0)
    config = transformers.GptOssConfig(**TINY_GPT_OSS)
    model = transformers.GptOssForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("sinks"):
                param.normal_(0.0, 2.0)
            elif param.dim() > 1 or name.endswith("bias"):
                param.normal_(0.0, 0.2)
            else:
                param.uniform_(0.5, 1.5)  # norms away from 1
    for layer in model.model.layers:  # the GPU image's transformers (5.17) fixes it at 7
        layer.mlp.experts.limit = config.swiglu_limit
    return model.eval()


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("gpt_oss")
    hf_model = _hf_model()
    hf_model.save_pretrained(folder)
    return folder, hf_model


def test_config_reads_as_transformers_builds_it(gpt_oss: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig

    config = ModelConfig.from_hf_folder(gpt_oss[0])
    assert config.attention_sinks and config.qkv_bias and config.o_bias
    assert config.layer_windows == (4, 0)
    assert config.moe is not None and config.moe.clamped is not None
    assert (config.moe.clamped.alpha, config.moe.clamped.limit) == (1.702, 1.0)
    assert config.rope_scaling is not None and config.rope_scaling["rope_type"] == "yarn"
    bare = {k: v for k, v in gpt_oss[1].config.to_dict().items() if k != "attention_bias"}
    defaults = ModelConfig.from_hf_dict({**bare, "num_hidden_layers": 4, "layer_types": None})
    assert defaults.layer_windows == (4, 0, 4, 0) and defaults.o_bias  # transformers' defaults


def test_greedy_matches_hf_with_chunked_prefill(gpt_oss: tuple[Path, Any]) -> None:
    assert_greedy_matches(*gpt_oss)


def test_triton_ops_match_hf(gpt_oss: tuple[Path, Any]) -> None:
    """The extend kernel (windowed layer 0, full layer 1) and the decode kernel with sinks, the
    fused experts with biases and the clamp, under TRITON_INTERPRET=1."""
    folder, hf_model = gpt_oss
    _assert_runner_greedy_matches(runner_for(folder, backend="triton"), hf_model, 4)


def _assert_runner_greedy_matches(runner: Any, hf_model: Any, num_new: int, chunk: int = 6) -> None:
    """The runner's greedy tokens equal transformers' (the Triton interpreter: 4 of them)."""
    expected = [hf_greedy(hf_model, p, num_new) for p in PROMPTS]
    driver = PlanDriver(runner, chunk=chunk)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(num_new)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected


def test_sinks_clamp_and_window_matter() -> None:
    """Each of the three, taken out of transformers' model, changes its logits."""
    ids = torch.tensor([PROMPTS[0]])
    base_model = _hf_model()
    with torch.no_grad():
        base = base_model(ids).logits[0, -1]
        changed = []
        for change in ("sinks", "clamp", "window"):
            hf_model = _hf_model()
            for layer in hf_model.model.layers:
                if change == "sinks":
                    layer.self_attn.sinks.fill_(-1e4)
                elif change == "clamp":
                    layer.mlp.experts.limit = 1e4
                else:
                    layer.self_attn.sliding_window = None
            if change == "window":
                hf_model.config.layer_types = ["full_attention"] * len(hf_model.model.layers)
            changed.append(hf_model(ids).logits[0, -1])
    for logits in changed:
        assert (logits - base).abs().max() > 1e-2


def _quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks [..., G, 16] uint8, scales [..., G] uint8) of weight [..., G * 32]: each group's
    exponent the smallest that brings its largest value within 6, each value rounded to the
    nearest e2m1 code (low nibble first)."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    groups = weight.reshape(*weight.shape[:-1], -1, 32).float()
    peak = groups.abs().amax(-1).clamp(min=1e-30)
    exponent = torch.ceil(torch.log2(peak / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)[..., None]
    magnitude = (scaled.abs()[..., None] - grid).abs().argmin(-1)
    codes = (magnitude | ((scaled < 0).long() << 3)).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exponent + 127).to(torch.uint8)


def test_mxfp4_dequantizes_every_byte_as_transformers() -> None:
    """All 256 bytes (both nibbles, both signs) under exponents from 2^-127 to 2^128."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    from troupe.gpu.gpt_oss_weights import dequantize_mxfp4

    blocks = torch.arange(256, dtype=torch.uint8).reshape(2, 8, 16).repeat(3, 1, 1, 1)
    scales = torch.tensor([0, 1, 64, 127, 128, 200, 254, 255], dtype=torch.uint8)
    scales = scales.repeat(3, 2, 1)  # [E=3, N=2, G=8]
    ours = dequantize_mxfp4(blocks.reshape(3, 2, 8, 16), scales)
    theirs = convert_moe_packed_tensors(blocks.reshape(3, 2, 8, 16), scales)  # [E, K, N]
    assert ours.dtype == torch.bfloat16 and ours.shape == (3, 2, 256)
    assert torch.equal(ours, theirs.transpose(1, 2))


def _mxfp4_checkpoint(folder: Path) -> Any:
    """The experts saved into `folder` as OpenAI's MXFP4 blocks and scales, config.json's
    quantization_config saying mxfp4 as the released files' does; returns a transformers model
    holding transformers' dequantization of the same bytes."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    hf_model = _hf_model()
    tensors = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    with torch.no_grad():
        for index, layer in enumerate(hf_model.model.layers):
            experts = layer.mlp.experts
            prefix = f"model.layers.{index}.mlp.experts"
            for name in ("gate_up_proj", "down_proj"):
                param = getattr(experts, name)  # [E, K, N]: rows of N over K inputs
                blocks, scales = _quantize_mxfp4(param.transpose(1, 2))
                del tensors[f"{prefix}.{name}"]
                tensors[f"{prefix}.{name}_blocks"] = blocks.contiguous()
                tensors[f"{prefix}.{name}_scales"] = scales.contiguous()
                dequantized = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
                assert (dequantized - param).abs().max() > 0  # rounded: not the dense weights
                param.copy_(dequantized)
    hf_model.config.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return hf_model


@pytest.mark.parametrize("quantization", ["auto", "keep"])
def test_mxfp4_checkpoint_matches_transformers_dequantized(
    tmp_path: Path, quantization: Quantization
) -> None:
    """Unpacked at load ("auto", as bf16's GEMMs were measured faster), or kept packed
    ("keep": the layer holds uint8 blocks and scales, the experts' op unpacks them as it
    multiplies)."""
    hf_model = _mxfp4_checkpoint(tmp_path)
    runner = runner_for(tmp_path, quantization=quantization)
    moe = runner.model.config.moe
    assert moe is not None and moe.mxfp4 == (quantization == "keep")
    kinds = {p.dtype for n, p in runner.model.named_parameters() if "w13" in n or "w2" in n}
    assert kinds == {torch.uint8 if quantization == "keep" else torch.float32}
    _assert_runner_greedy_matches(runner, hf_model, NUM_NEW, chunk=5)


def test_mxfp4_kept_packed_on_the_triton_ops(tmp_path: Path) -> None:
    """The packed experts through the Triton GEMMs (kernels/fused_moe_mxfp4.py; the
    interpreter here) beside the sinks' kernels."""
    hf_model = _mxfp4_checkpoint(tmp_path)
    runner = runner_for(tmp_path, backend="triton", quantization="keep")
    _assert_runner_greedy_matches(runner, hf_model, 4)


def test_mxfp4_pipeline_stages_equal_transformers(tmp_path: Path) -> None:
    """The whole engine from the MXFP4 files over two pipeline stages (gloo processes; each
    holds one layer, a windowed and a full one, with its sinks and experts): transformers'
    greedy tokens."""
    import anyio
    from graph_helpers import collect_all, token_ids, wait_blocks_free
    from troupe import Engine, EngineConfig
    from troupe.messages import SamplingParams

    from tests.gpu.conftest import add_word_tokenizer

    hf_model = _mxfp4_checkpoint(tmp_path)
    add_word_tokenizer(tmp_path)
    expected = [hf_greedy(hf_model, p, NUM_NEW) for p in PROMPTS]
    config = EngineConfig(
        model=str(tmp_path), device="cpu", dtype="float32", block_size=4, num_kv_blocks=32,
        max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64, pipeline_parallel_size=2,
    )  # fmt: skip
    params = SamplingParams(max_tokens=NUM_NEW, temperature=0.0, ignore_eos=True)

    async def run() -> list[list[int]]:
        async with Engine.open(config) as engine:
            results = await collect_all(engine, [(p, params) for p in PROMPTS])
            await wait_blocks_free(engine, timeout=60)
            return [token_ids(events) for events in results]

    assert anyio.run(run) == expected


def test_tensor_parallelism_is_refused(gpt_oss: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError
    from troupe.gpu.tp_model import TPDecoderModel

    config = ModelConfig.from_hf_folder(gpt_oss[0])
    with pytest.raises(ModelLoadError, match="tensor parallelism is not supported"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 0)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(gpt_oss: tuple[Path, Any]) -> None:
    assert_greedy_matches(*gpt_oss, device="cuda")


assert NUM_NEW >= 8  # the greedy runs reach past layer 0's window
