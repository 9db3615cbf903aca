"""The phase router core (prefill/decode disaggregation), driven by hand-built plans and
answers: how a plan splits, which transfers it announces, how answers join, and which side
holds each block afterwards."""

from __future__ import annotations

import pytest
from troupe.actors.core.phase_router import PhaseRouterCore
from troupe.messages import (
    FailedSeq,
    Phase,
    PhaseStepResult,
    SampledToken,
    SamplingParams,
    SeqFailureReason,
    SeqWork,
    StepPlan,
    StepResult,
)
from troupe.request_seeds import SeedSource

P, D = Phase.PREFILL, Phase.DECODE
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


def _router() -> PhaseRouterCore:
    return PhaseRouterCore(block_size=4, seed=7)


def _shares(router: PhaseRouterCore, plan: StepPlan) -> dict[str, StepPlan]:
    """The executors' shares of `plan`; a result answered at once is kept in ANSWERED."""
    shares: dict[str, StepPlan] = {}
    for dest, msg in router.handle([plan]):
        if isinstance(msg, StepResult):
            ANSWERED.append(msg)
        else:
            assert isinstance(msg, StepPlan)
            shares[dest] = msg
    return shares


ANSWERED: list[StepResult] = []


def _answer(
    step_id: int, phase: Phase, *tokens: tuple[str, int], time: float = 1.0
) -> PhaseStepResult:
    sampled = tuple(SampledToken(rid, tok) for rid, tok in tokens)
    return PhaseStepResult(
        phase=phase, result=StepResult(step_id=step_id, time=time, sampled=sampled)
    )


def _prompt(
    rid: str,
    start: int,
    tokens: list[int],
    blocks: tuple[int, ...],
    *,
    sample: bool,
    params: SamplingParams | None = GREEDY,
    reset: bool = False,
) -> SeqWork:
    return SeqWork(
        request_id=rid,
        token_ids=tuple(tokens),
        start_pos=start,
        block_ids=blocks,
        sample=sample,
        params=params,
        num_prompt_tokens=10 if params else 0,
        reset=reset,
    )


def test_chunks_go_to_prefill_and_the_first_decode_moves_the_blocks() -> None:
    router = _router()
    # step 1: a 10-token prompt in two chunks (blocks 3, 5, 8); the first chunk
    shares = _shares(
        router, StepPlan(step_id=1, seqs=(_prompt("a", 0, list(range(6)), (3, 5), sample=False),))
    )
    assert set(shares) == {"prefill_executor"}
    first = shares["prefill_executor"].seqs[0]
    assert first.reset and first.block_ids == (3, 5) and first.params is not None
    # it samples nothing: the step is answered at once, the prefill side works on
    assert ANSWERED.pop() == StepResult(step_id=1, time=0.0)
    assert router.joins.num_ahead == 1
    assert router.handle([_answer(1, P)]) == []
    assert router.joins.num_ahead == 0
    # step 2: the last chunk samples on the prefill side
    last = SeqWork(request_id="a", token_ids=(6, 7, 8, 9), start_pos=6, block_ids=(8,))
    shares = _shares(router, StepPlan(step_id=2, seqs=(last,)))
    assert shares["prefill_executor"].seqs == (last,)  # held there: passed as is
    assert shares["prefill_executor"].send_blocks == ()
    router.handle([_answer(2, P, ("a", 42))])
    # step 3: its first decode (position 10, in block 8) goes to decode with the whole table
    decode = SeqWork(request_id="a", token_ids=(42,), start_pos=10)
    shares = _shares(router, StepPlan(step_id=3, seqs=(decode,)))
    assert set(shares) == {"prefill_executor", "executor"}
    to_p, to_d = shares["prefill_executor"], shares["executor"]
    assert to_p.seqs == () and to_p.released == ("a",) and to_p.send_blocks == (3, 5, 8)
    assert to_d.recv_blocks == (3, 5, 8) and to_d.send_blocks == () and to_p.recv_blocks == ()
    moved = to_d.seqs[0]
    assert moved.reset and moved.block_ids == (3, 5, 8) and moved.start_pos == 10
    assert moved.params is not None and moved.num_prompt_tokens == 10
    assert router.residency.snapshot() == {3: {P, D}, 5: {P, D}, 8: {D}}
    # step 4: the next decode stays on decode, no transfer
    shares = _shares(
        router, StepPlan(step_id=4, seqs=(SeqWork(request_id="a", token_ids=(43,), start_pos=11),))
    )
    router.handle([_answer(3, P), _answer(3, D, ("a", 43))])
    assert set(shares) == {"executor"} and shares["executor"].recv_blocks == ()
    # the end: released on the side holding it
    shares = _shares(router, StepPlan(step_id=5, seqs=(), released=("a",)))
    assert set(shares) == {"executor"} and shares["executor"].released == ("a",)
    assert router.requests == {}


def test_join_keeps_plan_order_and_failures_and_errors() -> None:
    router = _router()
    seqs = (
        _prompt("x", 0, [1, 2, 3], (0,), sample=True),
        _prompt("y", 0, [4, 5], (1,), sample=True),
    )
    router.handle([StepPlan(step_id=1, seqs=seqs)])
    router.handle([_answer(1, P, ("x", 9), ("y", 8))])
    # step 2: x and y decode; z is a new prompt: decode gets x, y; prefill gets z
    plan = StepPlan(
        step_id=2,
        seqs=(
            SeqWork(request_id="x", token_ids=(9,), start_pos=3),
            SeqWork(request_id="y", token_ids=(8,), start_pos=2),
            _prompt("z", 0, [6], (2,), sample=True),
        ),
    )
    shares = _shares(router, plan)
    assert [s.request_id for s in shares["executor"].seqs] == ["x", "y"]
    assert [s.request_id for s in shares["prefill_executor"].seqs] == ["z"]
    assert router.handle([_answer(2, P, ("z", 1), time=5.0)]) == []  # waits for decode
    failed = PhaseStepResult(
        phase=D,
        result=StepResult(
            step_id=2,
            time=3.0,
            sampled=(SampledToken("y", 7),),
            failed=(FailedSeq("x", SeqFailureReason.NON_FINITE_LOGITS),),
        ),
    )
    [(dest, joined)] = router.handle([failed])
    assert dest == "scheduler"
    assert joined == StepResult(
        step_id=2,
        time=5.0,
        sampled=(SampledToken("y", 7), SampledToken("z", 1)),
        failed=(FailedSeq("x", SeqFailureReason.NON_FINITE_LOGITS),),
    )
    # an error on one side fails the step
    router.handle(
        [
            StepPlan(
                step_id=3,
                seqs=(
                    SeqWork(request_id="y", token_ids=(7,), start_pos=3),
                    SeqWork(request_id="z", token_ids=(1,), start_pos=1),
                ),
            )
        ]
    )
    error = PhaseStepResult(phase=D, result=StepResult(step_id=3, time=2.0, error="boom"))
    # z moved: the prefill side sends its block and releases it (samples nothing: not awaited)
    [(_, joined)] = router.handle([error])
    assert joined.error == "decode executor: boom" and joined.sampled == ()
    assert router.handle([_answer(3, P)]) == []
    with pytest.raises(ValueError, match="not awaited"):
        router.handle([_answer(3, D)])


def test_prefix_hit_on_blocks_decode_wrote_moves_them_back() -> None:
    router = _router()
    router.handle(
        [StepPlan(step_id=1, seqs=(_prompt("a", 0, [1, 2, 3, 4, 5, 6], (0, 1), sample=True),))]
    )
    router.handle([_answer(1, P, ("a", 7))])
    router.handle(
        [StepPlan(step_id=2, seqs=(SeqWork(request_id="a", token_ids=(7,), start_pos=6),))]
    )
    router.handle([_answer(2, P), _answer(2, D, ("a", 8))])
    router.handle(
        [StepPlan(step_id=3, seqs=(SeqWork(request_id="a", token_ids=(8,), start_pos=7),))]
    )
    router.handle([_answer(3, D, ("a", 9))])
    assert router.residency.snapshot() == {0: {P, D}, 1: {D}}  # decode finished block 1
    # b: a multi-turn prompt hitting a's two full blocks; its own chunk starts at 8 in block 4
    hit = _prompt("b", 8, [9, 10, 11], (0, 1, 4), sample=True)
    shares = _shares(router, StepPlan(step_id=4, seqs=(hit,), released=("a",)))
    to_p, to_d = shares["prefill_executor"], shares["executor"]
    assert to_d.released == ("a",) and to_d.send_blocks == (1,) and to_p.recv_blocks == (1,)
    assert to_p.send_blocks == () and to_d.recv_blocks == ()
    assert router.residency.snapshot() == {0: {P, D}, 1: {P, D}, 4: {P}}
    assert router.num_blocks_sent == {P: 2, D: 1}


def test_recompute_goes_back_to_prefill_with_params_and_history() -> None:
    router = _router()
    params = SamplingParams(max_tokens=8, temperature=0.0, repetition_penalty=1.5)
    router.handle(
        [StepPlan(step_id=1, seqs=(_prompt("a", 0, [5, 6, 7], (0,), sample=True, params=params),))]
    )
    router.handle([_answer(1, P, ("a", 8))])
    router.handle(
        [StepPlan(step_id=2, seqs=(SeqWork(request_id="a", token_ids=(8,), start_pos=3),))]
    )
    router.handle([_answer(2, P), _answer(2, D, ("a", 9))])
    # preempted (recompute): reset, everything again in fresh blocks, no params (executor has them)
    again = SeqWork(
        request_id="a", token_ids=(5, 6, 7, 8, 9), start_pos=0, block_ids=(2, 3), reset=True
    )
    shares = _shares(router, StepPlan(step_id=3, seqs=(again,)))
    to_p, to_d = shares["prefill_executor"], shares["executor"]
    assert to_d.released == ("a",) and to_d.seqs == ()
    moved = to_p.seqs[0]
    assert moved.reset and moved.block_ids == (2, 3) and moved.params is not None
    assert moved.params.repetition_penalty == 1.5 and moved.history == ()
    router.handle([_answer(3, P, ("a", 10)), _answer(3, D)])
    # back to decode: the history of positions 0..4 goes along (penalties read it)
    shares = _shares(
        router, StepPlan(step_id=4, seqs=(SeqWork(request_id="a", token_ids=(10,), start_pos=5),))
    )
    moved = shares["executor"].seqs[0]
    assert moved.history == (5, 6, 7, 8, 9) and shares["executor"].recv_blocks == (2, 3)


def test_seeds_are_drawn_as_one_executor_draws_them() -> None:
    router = _router()
    seeded = SamplingParams(max_tokens=4, temperature=1.0, seed=5)
    unseeded = SamplingParams(max_tokens=4, temperature=1.0)
    plan = StepPlan(
        step_id=1,
        seqs=(
            _prompt("a", 0, [1], (0,), sample=True, params=unseeded),
            _prompt("b", 0, [2], (1,), sample=True, params=seeded),
            _prompt("c", 0, [3], (2,), sample=True, params=unseeded),
        ),
    )
    seqs = _shares(router, plan)["prefill_executor"].seqs
    source = SeedSource(7)
    expected = [source.draw(), 5, source.draw()]
    assert [s.params.seed for s in seqs if s.params is not None] == expected


def test_refusals_and_an_empty_step() -> None:
    router = _router()
    with pytest.raises(ValueError, match="swaps or block copies"):
        router.handle([StepPlan(step_id=1, seqs=(), swap_out=((1, 0),))])
    [(dest, result)] = router.handle([StepPlan(step_id=2, seqs=())])  # nothing to run
    assert (dest, result) == ("scheduler", StepResult(step_id=2, time=0.0))
    # reading a block nobody wrote is a bug the router names
    with pytest.raises(AssertionError, match=r"block 6 .* never written"):
        router.handle([StepPlan(step_id=3, seqs=(_prompt("q", 4, [1], (6, 7), sample=True),))])


def test_prefill_runs_ahead_and_a_late_error_fails_the_next_step() -> None:
    router = _router()
    chunk = _prompt("a", 0, [1, 2, 3, 4], (0,), sample=False)
    other = _prompt("b", 0, [5], (1,), sample=True)
    router.handle([StepPlan(step_id=1, seqs=(other,))])
    router.handle([_answer(1, P, ("b", 6))])
    # step 2: b decodes (awaited), a's chunk samples nothing (not awaited)
    plan = StepPlan(step_id=2, seqs=(SeqWork(request_id="b", token_ids=(6,), start_pos=1), chunk))
    shares = _shares(router, plan)
    assert set(shares) == {"prefill_executor", "executor"}
    [(_, joined)] = router.handle([_answer(2, D, ("b", 7), time=2.0)])
    assert joined == StepResult(step_id=2, time=2.0, sampled=(SampledToken("b", 7),))
    # step 3 is planned while the prefill side still runs step 2: its share queues behind it
    more = SeqWork(request_id="a", token_ids=(9,), start_pos=4, block_ids=(2,), sample=False)
    decode = SeqWork(request_id="b", token_ids=(7,), start_pos=2)
    shares = _shares(router, StepPlan(step_id=3, seqs=(decode, more)))
    assert router.joins.num_ahead == 2
    late = PhaseStepResult(phase=P, result=StepResult(step_id=2, time=3.0, error="worker died"))
    assert router.handle([late, _answer(3, P)]) == []
    [(_, joined)] = router.handle([_answer(3, D, ("b", 8), time=4.0)])
    assert joined.error == "prefill executor (step 2): worker died"
    assert router.joins.num_ahead == 0 and router.joins.num_answered_ahead == 2


def test_a_history_the_scheduler_sends_is_kept_for_the_move() -> None:
    router = _router()
    params = SamplingParams(max_tokens=8, temperature=0.0, presence_penalty=1.0)
    first = SeqWork(
        request_id="a",
        token_ids=(7, 8),
        start_pos=4,  # four tokens from the prefix cache, their ids in `history`
        block_ids=(0, 1),
        params=params,
        num_prompt_tokens=6,
        history=(1, 2, 3, 4),
    )
    router.residency.written(P, [0])  # the cached block
    router.handle([StepPlan(step_id=1, seqs=(first,))])
    router.handle([_answer(1, P, ("a", 9))])
    shares = _shares(
        router, StepPlan(step_id=2, seqs=(SeqWork(request_id="a", token_ids=(9,), start_pos=6),))
    )
    assert shares["executor"].seqs[0].history == (1, 2, 3, 4, 7, 8)
