"""Attention-logit soft-capping (Gemma 2): each score becomes cap * tanh(score / cap) before the
mask and the softmax, as transformers' eager attention applies it (score = q . k * scale).

The attention kernels scale raw dot products late (qk * qk_scale, qk_scale = scale * log2(e),
the fp8 caches' k scale folded in, or folded into exp2's argument), so the cap is applied to the
raw product in those units: `softcap_raw` returns qk' with

    qk' * qk_scale = cap2 * tanh(qk * qk_scale / cap2),     cap2 = cap * log2(e)

which is the capped score in log2 units; the kernels then scale, mask and fold qk' as they do
qk. tanh is 2 sigmoid(2x) - 1 (fp32; the interpreter has no tanh): within ~1e-7 of it.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


def softcap_log2(softcap: float) -> float:
    """The kernels' `cap` argument: the cap in log2 units (0.0: no cap, unread)."""
    if softcap < 0:
        raise ValueError(f"softcap must be >= 0 (0: none); got {softcap}")
    return softcap * _LOG2E


@triton.jit
def softcap_raw(qk, qk_scale, cap):
    """The raw products qk (fp32) capped in the units they are scaled from (module doc)."""
    x = tl.minimum(tl.maximum(qk * (qk_scale / cap), -20.0), 20.0)  # tanh(20) is 1 in fp32
    return (2.0 * tl.sigmoid(2.0 * x) - 1.0) * (cap / qk_scale)
