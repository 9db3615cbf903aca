"""ops/mla_variant_sweep.py's table on the CPU (TRITON_INTERPRET=1): every swept launch config
computes the DeepSeek-V2-Lite-width latent attention right at a small context."""

from __future__ import annotations

import dataclasses

import torch
from troupe.kernels.mla_decode import DEFAULT_CONFIG, MlaVariant
from troupe.ops import mla_variant_sweep as sweep


def test_the_sweep_starts_at_the_default_and_drops_the_crashing_prefetch() -> None:
    assert sweep.CONFIGS[0] == DEFAULT_CONFIG
    assert not any(c.variant is MlaVariant.TOKENS_M and c.prefetch for c in sweep.CONFIGS)
    assert len(set(sweep.CONFIGS)) == len(sweep.CONFIGS)


def test_every_swept_config_is_correct_in_the_interpreter() -> None:
    """The interpreter ignores warps, stages and register caps: one config per distinct
    algorithm (variant, tile, split count, partials) of the list, 2 sequences x 272 tokens (two
    splits, a partial last tile at every block_n), 16 heads x 576-wide latent rows, float32."""
    ignored = {"num_warps": 4, "num_stages": 2, "max_registers": None}
    distinct = list(dict.fromkeys(dataclasses.replace(c, **ignored) for c in sweep.CONFIGS))
    rows = sweep.sweep_shape(2, 272, distinct, copy_bw=1e12, device="cpu", timer=lambda fn: 1.0,
                             dtype=torch.float32)  # fmt: skip
    assert sorted(map(str, (c for _, c in rows))) == sorted(map(str, distinct))
