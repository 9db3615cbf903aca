"""Greedy decoding through ModelRunner is token-identical to HF transformers (fp32, CPU)."""

from __future__ import annotations

import pytest

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 8, 64, 12, 31], [200, 1, 77, 13, 90, 4, 4, 4, 18]]
NUM_NEW = 12


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_greedy_matches_hf_with_chunked_prefill(family, hf_folder, mt) -> None:
    folder, hf_model = hf_folder(family)
    expected = [mt.hf_greedy(hf_model, p, NUM_NEW) for p in PROMPTS]
    driver = mt.PlanDriver(mt.runner_for(folder), chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    got = [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))]
    assert got == expected
    assert len(set(expected[0])) > 2  # the model is not stuck on one token


def test_triton_ops_match_hf_with_chunked_prefill(hf_folder, mt) -> None:
    """Qwen3 on the Triton ops (under TRITON_INTERPRET=1 here): chunks of 5 after a cached
    prefix take the extend kernel (new keys from the fused qkv rows), decodes the decode
    kernel; a chunk beside decodes is a mixed step."""
    folder, hf_model = hf_folder("qwen3")
    num_new = 4  # interpreter time
    expected = [mt.hf_greedy(hf_model, p, num_new) for p in PROMPTS]
    driver = mt.PlanDriver(mt.runner_for(folder, backend="triton"), chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(num_new)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected


def test_cached_prefix_blocks_are_reused(hf_folder, mt) -> None:
    folder, hf_model = hf_folder("llama")
    base = PROMPTS[0]
    second = [*base[:8], 150, 151, 152]  # shares two full blocks (block_size 4) with `base`
    driver = mt.PlanDriver(mt.runner_for(folder), chunk=16)
    first = driver.add("a", base)
    driver.step()  # a's whole prompt
    shared = first.blocks[:2]
    driver.add("b", second, shared_blocks=shared)
    driver.run(NUM_NEW)
    assert driver.seqs["b"].blocks[:2] == shared
    assert first.output == mt.hf_greedy(hf_model, base, NUM_NEW)
    assert driver.seqs["b"].output == mt.hf_greedy(hf_model, second, NUM_NEW)


def test_swap_out_and_in_mid_decode(hf_folder, mt) -> None:
    folder, hf_model = hf_folder("qwen3")
    driver = mt.PlanDriver(mt.runner_for(folder, num_cpu_blocks=8), chunk=16)
    a = driver.add("a", PROMPTS[0])
    b = driver.add("b", PROMPTS[1])
    for _ in range(4):
        driver.step()
    # swap b out; its GPU blocks go to a newcomer that overwrites them
    cpu_blocks = list(range(len(b.blocks)))
    swap_out = tuple(zip(b.blocks, cpu_blocks, strict=True))
    driver.free = b.blocks + driver.free
    b.blocks = []
    driver.add("c", PROMPTS[1][::-1])
    driver.step(["a", "c"], swap_out=swap_out)
    driver.step(["a", "c"])
    new_gpu = [driver.free.pop() for _ in cpu_blocks]
    b.blocks, b.started = new_gpu, False  # rescheduled: reset=True with the new table
    swap_in = tuple(zip(cpu_blocks, new_gpu, strict=True))
    driver.step(["a", "b", "c"], swap_in=swap_in)
    driver.run(NUM_NEW)
    assert a.output == mt.hf_greedy(hf_model, PROMPTS[0], NUM_NEW)
    assert b.output == mt.hf_greedy(hf_model, PROMPTS[1], NUM_NEW)
    assert driver.seqs["c"].output == mt.hf_greedy(hf_model, PROMPTS[1][::-1], NUM_NEW)
