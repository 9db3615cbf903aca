"""Plans of pooled requests (SamplingParams.pooling): every chunk that holds prompt positions
says so (SeqWork.pools) and makes its step read hidden states (StepPlan.reads_hidden), the
prompt's last token too when a chunk cut one short leaves it alone in a block it holds: it is
planned like a decode with no new block, but plan_builder.py's hot path takes only true
decodes (that token's embedding was lost: tests/gpu/test_embeddings.py)."""

from __future__ import annotations

import pytest
from troupe.messages import AdmittedRequest, Pooling, SamplingParams
from troupe.ops.bench_scheduler import build_loop

from tests.actors.core.allocator_invariants import check_allocator

PROMPT = tuple(200 + 3 * j for j in range(19))  # 9 + 9 + 1 beside three decodes


def _request(rid: str, prompt: tuple[int, ...], params: SamplingParams) -> AdmittedRequest:
    return AdmittedRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        params=params,
        arrival_time=0.0,
        max_total_tokens=len(prompt) + (params.max_tokens or 0),
    )


@pytest.mark.parametrize("pooling", [Pooling(type="mean"), Pooling(type="last")])
def test_a_prompts_last_token_computed_alone_is_pooled(pooling: Pooling) -> None:
    loop = build_loop(
        block_size=4,
        num_gpu_blocks=64,
        num_cpu_blocks=0,
        max_num_seqs=4,
        max_num_batched_tokens=12,
        check=check_allocator,
    )
    decode = SamplingParams(max_tokens=30, ignore_eos=True)
    loop.submit([_request(f"d{i}", (7 + i, 8, 9), decode) for i in range(3)])
    pooled = SamplingParams(max_tokens=2, ignore_eos=True, pooling=pooling)
    loop.run(inject={6: [_request("p", PROMPT, pooled)]})
    works = [(plan, w) for plan in loop.plans for w in plan.seqs if w.request_id == "p"]
    chunks = [(w.start_pos, w.num_tokens) for _, w in works]
    # the last prompt token alone, in a block it holds: planned as a decode with no new block
    assert chunks[:3] == [(0, 9), (9, 9), (18, 1)]
    for plan, work in works[:3]:
        assert work.pools and plan.reads_hidden, work
    assert not any(w.pools for _, w in works[3:])  # its output tokens are not pooled
    assert len(loop.tokens["p"]) == 2
