"""The fake runner models the KV cache: right blocks give the reference tokens, wrong ones don't."""

from __future__ import annotations

import pytest
from troupe.config import EngineConfig
from troupe.gpu.fake_runner import EOS_SEED_BASE, FakeRunner
from troupe.messages import SamplingParams, SeqWork, StepPlan

PARAMS = SamplingParams(max_tokens=8)
PROMPT = tuple(range(300, 310))  # 10 tokens: blocks of 4 -> 3 blocks


def _runner() -> FakeRunner:
    return FakeRunner(block_size=4, num_gpu_blocks=16, num_cpu_blocks=8)


def _prefill(
    r: FakeRunner, blocks: tuple[int, ...], rid: str = "a", params: SamplingParams = PARAMS
) -> int:
    [tok] = r.execute(
        StepPlan(
            step_id=1,
            seqs=(
                SeqWork(
                    request_id=rid,
                    token_ids=PROMPT,
                    start_pos=0,
                    block_ids=blocks,
                    reset=True,
                    params=params,
                    num_prompt_tokens=len(PROMPT),
                ),
            ),
        )
    )
    return tok.token_id


def _decode(
    r: FakeRunner,
    token: int,
    pos: int,
    blocks: tuple[int, ...] = (),
    rid: str = "a",
    reset: bool = False,
    **plan: object,
) -> int:
    [tok] = r.execute(
        StepPlan(
            step_id=2,
            seqs=(
                SeqWork(
                    request_id=rid, token_ids=(token,), start_pos=pos, block_ids=blocks, reset=reset
                ),
            ),
            **plan,
        )
    )  # type: ignore[arg-type]
    return tok.token_id


def test_reference_tokens_match_paged_execution_and_depend_on_seed() -> None:
    ref = FakeRunner.reference_tokens(PROMPT, 4, PARAMS)
    r = _runner()
    got = [_prefill(r, (5, 1, 9))]
    got.append(_decode(r, got[-1], 10))
    got.append(_decode(r, got[-1], 11))
    got.append(_decode(r, got[-1], 12, (3,)))
    assert got == ref
    assert all(100 <= t < 30000 for t in ref) and len(set(ref)) == 4
    assert FakeRunner.reference_tokens(PROMPT, 4, SamplingParams(seed=7)) != ref
    assert FakeRunner.reference_tokens((*PROMPT[:-1], 301), 4, PARAMS)[0] != ref[0]


def test_swap_round_trip_keeps_the_output() -> None:
    ref = FakeRunner.reference_tokens(PROMPT, 2, PARAMS)
    r = _runner()
    first = _prefill(r, (0, 1, 2))
    # Swap out to CPU 4..6, back into GPU 7, 8, 9 (a fresh table), then decode.
    r.execute(StepPlan(step_id=2, seqs=(), swap_out=((0, 4), (1, 5), (2, 6))))
    _prefill(r, (0, 1, 2), rid="other")  # overwrite the old GPU blocks
    nxt = _decode(r, first, 10, (7, 8, 9), reset=True, swap_in=((4, 7), (5, 8), (6, 9)))
    assert [first, nxt] == ref


def test_wrong_or_stale_blocks_change_the_output_or_raise() -> None:
    ref = FakeRunner.reference_tokens(PROMPT, 2, PARAMS)
    r = _runner()
    first = _prefill(r, (0, 1, 2))
    _prefill(r, (3, 4, 5), rid="b", params=SamplingParams(seed=1))
    # Swapped table order: positions do not match -> the runner reports corruption.
    with pytest.raises(RuntimeError, match=r"KV cache corruption.*'a'"):
        _decode(r, first, 10, (1, 0, 2), reset=True)
    # Another request's block in the table at the right position: a different token.
    r2 = _runner()
    first = _prefill(r2, (0, 1, 2))
    r2.execute(
        StepPlan(
            step_id=3,
            seqs=(
                SeqWork(
                    request_id="c",
                    token_ids=(1, 2, 3, 4),
                    start_pos=0,
                    block_ids=(6,),
                    reset=True,
                    params=PARAMS,
                ),
            ),
        )
    )
    assert _decode(r2, first, 10, (6, 1, 2), reset=True) != ref[1]


def test_eos_appears_at_the_requested_output_index() -> None:
    params = SamplingParams(seed=EOS_SEED_BASE + 3)
    ref = FakeRunner.reference_tokens(PROMPT, 4, params)
    assert ref[2] == 2 and 2 not in (ref[0], ref[1], ref[3])
    r = _runner()
    got = [_prefill(r, (0, 1, 2), params=params)]
    for pos in (10, 11):
        got.append(_decode(r, got[-1], pos, (3,) if pos == 12 else ()))
    assert got == ref[:3]


def test_released_state_is_dropped_and_first_work_needs_params() -> None:
    r = _runner()
    _prefill(r, (0, 1, 2))
    r.execute(StepPlan(step_id=3, seqs=(), released=("a",)))
    assert r.num_live == 0
    with pytest.raises(ValueError, match="carries no params"):
        _decode(r, 5, 10)


def test_from_config_defaults() -> None:
    r = FakeRunner.from_config(EngineConfig(runner="fake", num_kv_blocks=None))
    assert (r.num_gpu_blocks, r.num_cpu_blocks, r.vocab_size, r.max_model_len, r.eos_token_ids) == (
        4096,
        1024,
        49152,
        8192,
        (2,),
    )
    r = FakeRunner.from_config(EngineConfig(runner="fake", num_kv_blocks=64, max_model_len=512))
    assert (r.num_gpu_blocks, r.max_model_len) == (64, 512)


def test_256_decodes_at_1000_tokens_follow_the_reference() -> None:
    """A wide decode batch at long context (the shape `troupe bench scheduler` times: no test
    here depends on speed) gives each sequence its reference tokens."""
    r = FakeRunner(block_size=16, num_gpu_blocks=256 * 64, num_cpu_blocks=0)
    seqs = tuple(
        SeqWork(
            request_id=f"r{i}",
            token_ids=tuple(range(100, 1100)),
            start_pos=0,
            block_ids=tuple(range(i * 64, i * 64 + 64)),
            reset=True,
            params=PARAMS,
            num_prompt_tokens=1000,
        )
        for i in range(256)
    )
    last = {s.request_id: s.token_id for s in r.execute(StepPlan(step_id=1, seqs=seqs))}
    out = {rid: [tok] for rid, tok in last.items()}
    for step in range(10):
        plan = StepPlan(
            step_id=2 + step,
            seqs=tuple(
                SeqWork(request_id=rid, token_ids=(tok,), start_pos=1000 + step)
                for rid, tok in last.items()
            ),
        )
        last = {s.request_id: s.token_id for s in r.execute(plan)}
        for rid, tok in last.items():
            out[rid].append(tok)
    prompt = tuple(range(100, 1100))
    assert out["r0"] == out["r255"] == FakeRunner.reference_tokens(prompt, 11, PARAMS)
