"""Held-back prompt tokens (step_planner.py): with an overlapping runner, a prompt whose last
chunk joins running decodes computes all but its last token, which the SeqWork names
(next_token) and the next plan computes as a decode; the runner samples it with the decodes'
early step (gpu/overlap_merge.py; tests/gpu/test_overlap_step.py). Outputs do not change; a
prompt alone, a prompt the cache serves but its last token, and a run without the switch
hold nothing back."""

from __future__ import annotations

from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import AdmittedRequest, SamplingParams, SeqWork
from troupe.ops.bench_scheduler import CoreLoop, build_loop

from tests.actors.core.allocator_invariants import check_allocator

BS = 4
PROMPTS = {
    "r0": tuple(100 + 7 * j for j in range(6)),
    "r1": tuple(300 + 11 * j for j in range(9)),
    "r2": tuple(300 + 11 * j for j in range(9)),  # r1's prompt: the cache serves 8 tokens
}
OUTPUTS = {"r0": 40, "r1": 5, "r2": 4}


def _loop(hold: bool) -> CoreLoop:
    return build_loop(
        block_size=BS,
        num_gpu_blocks=64,
        num_cpu_blocks=0,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        check=check_allocator,
        num_lookahead_tokens=1,
        hold_last_prompt_token=hold,
    )


def _request(rid: str) -> AdmittedRequest:
    prompt = PROMPTS[rid]
    return AdmittedRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        params=SamplingParams(max_tokens=OUTPUTS[rid], ignore_eos=True),
        arrival_time=0.0,
        max_total_tokens=len(prompt) + OUTPUTS[rid],
    )


def _run(hold: bool) -> CoreLoop:
    """r0 alone; r1 lands while r0 decodes; r2 (r1's prompt) once r1 has ended."""
    loop = _loop(hold)
    loop.submit([_request("r0")])
    loop.run(inject={8: [_request("r1")], 40: [_request("r2")]})
    return loop


def _works(loop: CoreLoop, rid: str) -> list[SeqWork]:
    return [w for plan in loop.plans for w in plan.seqs if w.request_id == rid]


def test_a_prompt_joining_decodes_holds_back_its_last_token() -> None:
    loop = _run(hold=True)
    r0, r1, r2 = (_works(loop, rid) for rid in ("r0", "r1", "r2"))
    # r0 started alone: its whole prompt, sampled
    assert r0[0].token_ids == PROMPTS["r0"] and r0[0].sample and r0[0].next_token == -1
    # r1 joined r0's decodes: all but its last token, which the SeqWork names
    assert r1[0].token_ids == PROMPTS["r1"][:-1] and not r1[0].sample
    assert r1[0].next_token == PROMPTS["r1"][-1]
    assert len(r1[0].block_ids) * BS >= len(PROMPTS["r1"])  # the table covers the held token
    # ... computed in the next step as a decode, in the same plan as r0's next decode
    assert (r1[1].token_ids, r1[1].start_pos, r1[1].sample) == ((PROMPTS["r1"][-1],), 8, True)
    held_plan = next(i for i, p in enumerate(loop.plans) if r1[0] in p.seqs)
    assert [w.request_id for w in loop.plans[held_plan + 1].seqs] == ["r0", "r1"]
    # r2: the cache serves 8 of its 9 tokens; one is left, so nothing is held back
    assert r2[0].start_pos == 8 and r2[0].sample and r2[0].next_token == -1
    for rid in PROMPTS:
        expected = FakeRunner.reference_tokens(PROMPTS[rid], OUTPUTS[rid])
        assert loop.tokens[rid] == expected, rid
    stats = loop.batches[-1].stats
    assert stats is not None and stats.num_gpu_blocks_used == 0


def test_without_the_switch_nothing_is_held_back() -> None:
    held, plain = _run(hold=True), _run(hold=False)
    assert all(w.next_token == -1 for p in plain.plans for w in p.seqs)
    assert _works(plain, "r1")[0].token_ids == PROMPTS["r1"]
    assert dict(plain.tokens) == dict(held.tokens)
    assert _first_token_step(held, "r1") == _first_token_step(plain, "r1") + 1


def _first_token_step(loop: CoreLoop, rid: str) -> int:
    return next(b.step_id for b in loop.batches if any(o.request_id == rid for o in b.outputs))
