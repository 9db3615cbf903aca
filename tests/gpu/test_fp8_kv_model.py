"""fp8 KV through the model runner (CPU, the torch path that emulates the kernels' rounding):
pools hold e4m3 bytes, scales are set by the first real write, swaps move the bytes, and greedy
decoding of a tiny model stays close to HF's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.weights import load_model
from troupe.kernels.kv_quant import FP8_DTYPE
from troupe.kernels.ops import KernelBackend

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 8, 64, 12, 31], [200, 1, 77, 13, 90, 4, 4, 4, 18]]


def _fp8_runner(
    folder: Path, num_cpu_blocks: int = 0, backend: KernelBackend = "auto", device: str = "cpu"
) -> ModelRunner:
    config, model = load_model(folder, torch.float32, torch.device(device), 256, backend)
    options = RunnerOptions(
        block_size=4, num_gpu_blocks=64, num_cpu_blocks=num_cpu_blocks, max_model_len=256,
        kv_cache_dtype="fp8",
    )  # fmt: skip
    return ModelRunner(config, model, options)


def test_fp8_greedy_matches_hf(hf_folder: Any, mt: Any) -> None:
    folder, hf_model = hf_folder("qwen3")  # q/k norm: the scale bound sees normed keys
    runner = _fp8_runner(folder)
    assert runner.kv.layers[0][0].dtype == FP8_DTYPE
    assert runner.kv.scales is not None and not runner.kv.scales.any()  # unset until written
    driver = mt.PlanDriver(runner, chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(10)
    assert (runner.kv.scales > 0).all()
    # e4m3 keeps 3 mantissa bits (logits of this random tiny model move ~4%): near-ties may
    # flip later tokens; the first (the prompt read back through fp8 KV) must not
    for i, prompt in enumerate(PROMPTS):
        got, want = driver.seqs[f"r{i}"].output, mt.hf_greedy(hf_model, prompt, 10)
        assert got[:2] == want[:2]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fp8_triton_ops_match_the_reference_ops(hf_folder: Any, mt: Any, device: str) -> None:
    """fp8 KV on the Triton ops (under TRITON_INTERPRET=1 on the CPU): prefill chunks take the
    extend kernel, its new keys the cache's units from the fused qkv rows; the same rounding as
    the torch path's, so the same greedy tokens."""
    folder, _ = hf_folder("qwen3")
    outputs = []
    for backend in ("torch", "triton"):
        runner = _fp8_runner(folder, backend=backend, device=device)
        driver = mt.PlanDriver(runner, chunk=5)
        for i, prompt in enumerate(PROMPTS):
            driver.add(f"r{i}", prompt)
        driver.run(4)
        outputs.append([driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))])
    assert outputs[0] == outputs[1]


def test_fp8_logits_stay_close(hf_folder: Any) -> None:
    """One prefill, the same weights: fp8 KV moves the logits by a few percent, no more."""
    from troupe.gpu.attention import AttentionMetadata

    folder, _ = hf_folder("llama")
    config, model = load_model(folder, torch.float32, torch.device("cpu"), 256)
    ids = torch.tensor([200, 1, 77, 13, 90, 4, 4, 4, 18, 5, 6, 7])
    n = len(ids)

    def logits(dtype: torch.dtype) -> torch.Tensor:
        kv = KVCache(config, num_gpu_blocks=8, num_cpu_blocks=0, block_size=4, dtype=dtype,
                     device=torch.device("cpu"))  # fmt: skip
        model.set_kv_scales(kv.scales)
        meta = AttentionMetadata(
            slot_mapping=torch.arange(n), block_tables=torch.arange(3, dtype=torch.int32)[None],
            seq_lens=torch.tensor([n], dtype=torch.int32),
            query_start_loc=torch.tensor([0, n], dtype=torch.int32), max_query_len=n,
            max_seq_len=n, is_decode=False, logits_indices=torch.arange(n),
        )  # fmt: skip
        return model.compute_logits(model(ids, torch.arange(n), meta, kv.layers))

    exact, fp8 = logits(torch.float32), logits(FP8_DTYPE)
    rel = float((fp8 - exact).norm() / exact.norm())
    assert 1e-4 < rel < 0.1


def test_fp8_pool_halves_block_bytes_and_swaps_bytes() -> None:
    from troupe.gpu.pool_sizing import block_bytes
    from troupe.gpu.weights import qwen3_0_6b_config

    config = qwen3_0_6b_config()
    assert block_bytes(config, 16, FP8_DTYPE) * 2 == block_bytes(config, 16, torch.bfloat16)
    small = dict(config.__dict__, num_layers=2, num_kv_heads=2, head_dim=8)
    cfg = type(config)(**small)
    kv = KVCache(cfg, num_gpu_blocks=4, num_cpu_blocks=2, block_size=2, dtype=FP8_DTYPE,
                 device=torch.device("cpu"))  # fmt: skip
    k0 = kv.layers[1][0]
    k0[3] = torch.randn(2, 2, 8).to(FP8_DTYPE)
    before = k0[3].view(torch.uint8).clone()
    kv.swap_out([(3, 1)])
    k0[3] = torch.zeros(2, 2, 8).to(FP8_DTYPE)
    kv.swap_in([(1, 0)])
    assert torch.equal(k0[0].view(torch.uint8), before)
