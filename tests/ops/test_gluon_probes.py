"""The Gluon probes (ops/fp8_gluon_probe.py, ops/prefill_gluon_probe.py): Gluon has no
interpreter form, so the CPU builds each for sm_90 with Triton's own ptxas (a child process
without TRITON_INTERPRET) and checks what the build must hold; on a GPU (-m gpu) each kernel
is checked against the torch reference."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
import torch


def _build(module: str, launch: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", f"troupe.ops.{module}", "compile", launch]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert launch in done.stdout, done.stdout
    return done.stdout


def test_the_fp8_decode_builds_without_byte_reads() -> None:
    """Its tiles come by cp.async (LDGSTS), reach the tensor cores through ldmatrix, and no
    shared load reads bytes; the build also tells when this Triton's Gluon no longer takes it."""
    counts = dict(re.findall(r"'([A-Z0-9.]+)': (\d+)", _build("fp8_gluon_probe", "16/4/1/1/1")))
    assert counts["LDS.U8"] == "0" and int(counts["LDSM"]) > 0 and int(counts["LDGSTS"]) > 0
    assert int(counts["HMMA"]) > 0 and int(counts["F2FP"]) > 0


def test_the_prefill_builds_with_wgmma_and_no_spills() -> None:
    out = _build("prefill_gluon_probe", "128/64/4/8/1")
    assert int(re.search(r"(\d+) HGMMA", out).group(1)) > 0  # type: ignore[union-attr]
    assert re.search(r"stack 0,", out), out


@pytest.mark.gpu
@pytest.mark.parametrize("launch", ["gluon 16/4/1/1/0", "gluon 16/4/1/1/1", "gluon 64/3/4/1"])
def test_the_fp8_decode_matches_the_reference(launch: str) -> None:
    from troupe.kernels import reference
    from troupe.ops.fp8_gluon_probe import launcher
    from troupe.ops.fp8_variant_sweep import fp8_decode_batch

    batch, k8, v8, scales = fp8_decode_batch(8, 700)  # a partial last tile and page
    s, hq, dim = batch.q.shape
    ref = reference.paged_decode_attention(
        batch.q, k8, v8, batch.block_tables, batch.seq_lens, 1 / math.sqrt(dim),
        batch.max_seq_len, k_scale=scales, v_scale=scales,
    ).float()  # fmt: skip
    for splits in (1, 3):
        po = torch.zeros(s, hq, splits, dim, dtype=torch.float32, device="cuda")
        pl = torch.zeros(s, hq, splits, dtype=torch.float32, device="cuda")
        launcher(launch, batch, k8, v8, scales, splits, po, pl, batch.q)()
        weights = torch.exp2(pl - pl.amax(-1, keepdim=True))
        got = (po * weights[..., None]).sum(2) / weights.sum(-1)[..., None]
        assert (got - ref).norm() <= 1e-2 * ref.norm()


@pytest.mark.gpu
@pytest.mark.parametrize("launch", ["128/64/4/8/1", "64/64/4/4/1", "128/64/3/8/0"])
def test_the_prefill_matches_sdpa(launch: str) -> None:
    from troupe.ops.prefill_gluon_probe import launcher

    lens = [300, 1, 129, 64]  # partial blocks, a one-token sequence
    hq, hkv, dim = 16, 8, 128
    torch.manual_seed(0)
    q, k, v = (torch.randn(sum(lens), h, dim, device="cuda", dtype=torch.bfloat16)
               for h in (hq, hkv, hkv))  # fmt: skip
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda",
                      dtype=torch.int32)  # fmt: skip
    out = torch.full_like(q, float("nan"))
    launcher(launch, q, k, v, out, cu, max(lens))()
    for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        qs, ks, vs = (t[lo:hi].transpose(0, 1).float() for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(
            qs, ks, vs, is_causal=True, enable_gqa=True
        ).transpose(0, 1)
        got = out[lo:hi].float()
        assert (got - ref).norm() <= 1e-2 * ref.norm()
