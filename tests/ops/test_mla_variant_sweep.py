"""ops/mla_variant_sweep.py's table on the CPU (TRITON_INTERPRET=1): every swept launch config
computes the DeepSeek-V2-Lite-width latent attention right at a small context."""

from __future__ import annotations

import dataclasses

import torch
from troupe.kernels.mla_decode import DEFAULT_CONFIG
from troupe.ops import mla_variant_sweep as sweep


def test_the_sweep_starts_at_the_default_without_repeats() -> None:
    assert sweep.CONFIGS[0] == DEFAULT_CONFIG
    assert len(set(sweep.CONFIGS)) == len(sweep.CONFIGS)


def test_every_swept_config_is_correct_in_the_interpreter() -> None:
    """The interpreter ignores warps and stages: one config per distinct tile and split count
    of the list, 2 sequences x 272 tokens (two splits, a partial last tile at every block_n),
    16 heads x 576-wide latent rows, float32."""
    ignored = {"num_warps": 4, "num_stages": 2}
    distinct = list(dict.fromkeys(dataclasses.replace(c, **ignored) for c in sweep.CONFIGS))
    rows = sweep.sweep_shape(2, 272, distinct, copy_bw=1e12, device="cpu", timer=lambda fn: 1.0,
                             dtype=torch.float32)  # fmt: skip
    assert sorted(map(str, (c for _, c in rows))) == sorted(map(str, distinct))
