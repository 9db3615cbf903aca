"""Learned attention sinks (GPT-OSS): one logit per query head that joins every softmax as a key
whose value is zero. transformers' eager attention appends it as a last column of the scores,
takes the softmax, and drops that column:

    out = sum_j e^(s_j) v_j / (e^(sink) + sum_j e^(s_j))

so the weights no longer sum to one (the head may attend to nothing). The online softmax starts
from that key instead of from nothing: m = sink (log2 units, as the kernels keep m), l = 1,
acc = 0. A split decode gives the start to split 0 alone, so the merge counts the sink once.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def sink_start(sinks_ptr, heads, mask, m_i, l_i, SINKS: tl.constexpr):
    """(m_i, l_i) before the first key for rows of query heads `heads`: with SINKS, each head's
    sink (fp32 [Hq]) in log2 units and 1; as given otherwise (masked rows too)."""
    if SINKS:
        sink = tl.load(sinks_ptr + heads, mask=mask, other=0.0).to(tl.float32)
        m_i = tl.where(mask, sink * 1.4426950408889634, m_i)
        l_i = tl.where(mask, 1.0, l_i)
    return m_i, l_i
