"""ops/workload_floor.py: issue 9's floor as the issue counts it, and the matmul-aware one."""

from __future__ import annotations

import dataclasses

import pytest
from troupe.ops.fp8_kv_bench import LLAMA_8B
from troupe.ops.workload_floor import COPY_BYTES_PER_S as BW
from troupe.ops.workload_floor import MATMUL_FLOPS as F
from troupe.ops.workload_floor import Floor, floors, main


def test_a_toy_shape_by_hand() -> None:
    # 2 layers, hidden 8, 2 heads and 1 kv head of 4, intermediate 16, vocab 10:
    # layers 2 x (8 x 16 + 8 x 8 + 3 x 16 x 8) = 1,152 parameters, lm_head 80
    toy = dataclasses.replace(
        LLAMA_8B, hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4,
        intermediate_size=16, vocab_size=10,
    )  # fmt: skip
    issue, matmul = floors(
        toy, num_seqs=3, prompt_len=2, output_len=2, wave=2, kv_bytes_per_value=2
    )
    attention = 3 * 2 * 2 * 2**2 * 8  # sequences x (QK + PV, causal) x layers x P^2 x q
    assert issue.prefill_s == pytest.approx((2 * 1232 * 3 * 2 + attention) / F)
    # two waves (2 + 1) of 2 steps, each reading 1,152 + 2 x 80 bf16 parameters
    assert issue.decode_linear_s == pytest.approx(2 * 2 * 2 * 1312 / BW)
    # 3 sequences, contexts 2 and 3, 2 layers x 8 values x 2 bytes a token
    assert issue.kv_s == matmul.kv_s == pytest.approx(3 * 5 * 32 / BW)
    # so small a model reads its weights longer than it multiplies: the same decode floor
    assert matmul.decode_linear_s == pytest.approx(issue.decode_linear_s)
    assert matmul.prefill_s == pytest.approx((2 * 1152 * 6 + 2 * 80 * 3 + attention) / F)


def _eight_b(kv_bytes_per_value: int) -> tuple[Floor, Floor]:
    return floors(
        LLAMA_8B, num_seqs=512, prompt_len=1000, output_len=1000, wave=256,
        kv_bytes_per_value=kv_bytes_per_value,
    )  # fmt: skip


def test_the_8b_workload_reproduces_the_issue_and_its_matmul_bound() -> None:
    issue, matmul = _eight_b(2)
    assert issue.total_s == pytest.approx(41.3, abs=0.05)  # issue 9's "41.3 s floor"
    # 256 rows of an 8B model's linears take longer to multiply than to read
    assert matmul.decode_linear_s > issue.decode_linear_s
    _, fp8_matmul = _eight_b(1)
    assert fp8_matmul.kv_s == pytest.approx(matmul.kv_s / 2)
    assert 1.3 < matmul.total_s / fp8_matmul.total_s < 1.5


def test_the_report_prints_both_caches(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--num-seqs", "64", "--wave", "64"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out[2:6]] == [
        ["bf16", "issue"], ["bf16", "matmul"], ["fp8", "issue"], ["fp8", "matmul"],
    ]  # fmt: skip
    assert out[-1].startswith("fp8 KV over bf16 at equal efficiency (matmul floors)")
