"""The phase router never holds a step's decodes for a prompt's sampling chunk on the prefill
side: the step is answered when the decode side answers, names the prompt `late`, and its
token comes with the next result (LateTokens just before it), or alone when no step is in
flight. Driven by hand-built plans and answers: the prefill side's answer is withheld while
the decode side's arrives."""

from __future__ import annotations

from troupe.actors.core.phase_router import PhaseRouterCore
from troupe.messages import (
    FailedSeq,
    LateTokens,
    PhaseStepResult,
    SampledToken,
    SeqFailureReason,
    SeqWork,
    StepPlan,
    StepResult,
)

from tests.actors.core.test_phase_router import D, P, _answer, _prompt, _router


def _decode(rid: str, token: int, pos: int) -> SeqWork:
    return SeqWork(request_id=rid, token_ids=(token,), start_pos=pos)


def _decoding_b(router: PhaseRouterCore) -> None:
    """Step 1: b's prompt samples on the prefill side (no decodes: awaited there)."""
    assert router.handle([StepPlan(step_id=1, seqs=(_prompt("b", 0, [5], (1,), sample=True),))])
    [(_, first)] = router.handle([_answer(1, P, ("b", 6))])
    assert first == StepResult(step_id=1, time=1.0, sampled=(SampledToken("b", 6),))


def test_decodes_are_answered_while_a_sampling_chunk_computes() -> None:
    router = _router()
    _decoding_b(router)
    # step 2: b decodes; a's whole prompt samples on the prefill side
    plan = StepPlan(
        step_id=2, seqs=(_decode("b", 6, 1), _prompt("a", 0, [1, 2], (0,), sample=True))
    )
    sent = router.handle([plan])
    assert {dest for dest, _ in sent} == {"prefill_executor", "executor"}
    # the decode side answers; the prefill side has not: the step goes out, a is late
    [(dest, result)] = router.handle([_answer(2, D, ("b", 7), time=2.0)])
    assert dest == "scheduler"
    assert result == StepResult(step_id=2, time=2.0, sampled=(SampledToken("b", 7),), late=("a",))
    # step 3 is in flight when a's token comes: it waits for step 3's result
    router.handle([StepPlan(step_id=3, seqs=(_decode("b", 7, 2),))])
    assert router.handle([_answer(2, P, ("a", 9), time=3.0)]) == []
    out = router.handle([_answer(3, D, ("b", 8), time=4.0)])
    assert out == [
        (
            "scheduler",
            LateTokens(step_id=2, time=3.0, request_ids=("a",), sampled=(SampledToken("a", 9),)),
        ),
        ("scheduler", StepResult(step_id=3, time=4.0, sampled=(SampledToken("b", 8),))),
    ]
    assert router.joins.num_ahead == 0 and router.joins.num_late == 1
    # a's first decode moves it to the decode side with its blocks
    shares = dict(router.handle([StepPlan(step_id=4, seqs=(_decode("a", 9, 2),))]))
    assert shares["executor"].recv_blocks == (0,)  # type: ignore[union-attr]


def test_a_late_token_with_no_step_in_flight_goes_alone() -> None:
    router = _router()
    _decoding_b(router)
    plan = StepPlan(
        step_id=2, seqs=(_decode("b", 6, 1), _prompt("a", 0, [1, 2], (0,), sample=True))
    )
    router.handle([plan])
    [(_, result)] = router.handle([_answer(2, D, ("b", 7))])
    assert result.late == ("a",)  # type: ignore[union-attr]
    # the scheduler holds a and b is done: no step comes; a's token must not wait for one
    [(dest, late)] = router.handle([_answer(2, P, ("a", 9), time=5.0)])
    assert dest == "scheduler"
    assert late == LateTokens(
        step_id=2, time=5.0, request_ids=("a",), sampled=(SampledToken("a", 9),)
    )


def test_in_time_it_joins_and_without_decodes_it_is_awaited() -> None:
    router = _router()
    _decoding_b(router)
    plan = StepPlan(
        step_id=2, seqs=(_decode("b", 6, 1), _prompt("a", 0, [1, 2], (0,), sample=True))
    )
    router.handle([plan])
    assert router.handle([_answer(2, P, ("a", 9))]) == []  # in before the decode side
    [(_, result)] = router.handle([_answer(2, D, ("b", 7), time=2.0)])
    assert result == StepResult(
        step_id=2, time=2.0, sampled=(SampledToken("b", 7), SampledToken("a", 9))
    )
    # a step whose only share samples on the prefill side waits for it (nothing else answers)
    assert router.handle([StepPlan(step_id=3, seqs=(_prompt("c", 0, [3], (2,), sample=True),))])
    [(_, result)] = router.handle([_answer(3, P, ("c", 4))])
    assert result == StepResult(step_id=3, time=2.0, sampled=(SampledToken("c", 4),))


def test_late_failures_and_errors() -> None:
    router = _router()
    _decoding_b(router)
    seqs = (
        _decode("b", 6, 1),
        _prompt("a", 0, [1, 2], (0,), sample=True),
        _prompt("c", 0, [3], (2,), sample=True),
    )
    router.handle([StepPlan(step_id=2, seqs=seqs)])
    [(_, result)] = router.handle([_answer(2, D, ("b", 7))])
    assert result.late == ("a", "c")  # type: ignore[union-attr]
    nan = FailedSeq("a", SeqFailureReason.NON_FINITE_LOGITS)
    answer = StepResult(step_id=2, time=2.0, sampled=(SampledToken("c", 4),), failed=(nan,))
    [(_, late)] = router.handle([PhaseStepResult(phase=P, result=answer)])
    assert late == LateTokens(
        step_id=2, time=2.0, request_ids=("a", "c"), sampled=(SampledToken("c", 4),), failed=(nan,)
    )
    # an error on the late share fails its requests, and the next step answered
    plan = StepPlan(step_id=3, seqs=(_decode("b", 7, 2), _prompt("d", 0, [8], (3,), sample=True)))
    router.handle([plan])
    [(_, result)] = router.handle([_answer(3, D, ("b", 8))])
    assert result.late == ("d",)  # type: ignore[union-attr]
    died = StepResult(step_id=3, time=3.0, error="worker died")
    [(_, late)] = router.handle([PhaseStepResult(phase=P, result=died)])
    assert isinstance(late, LateTokens) and late.request_ids == ("d",)
    assert late.error == "prefill executor: worker died" and late.sampled == ()
    router.handle([StepPlan(step_id=4, seqs=(_decode("b", 8, 3),))])
    [(_, result)] = router.handle([_answer(4, D, ("b", 9))])
    assert result.error == "prefill executor (step 3): worker died"  # type: ignore[union-attr]


def test_a_failed_step_drops_its_late_answer() -> None:
    router = _router()
    _decoding_b(router)
    plan = StepPlan(
        step_id=2, seqs=(_decode("b", 6, 1), _prompt("a", 0, [1, 2], (0,), sample=True))
    )
    router.handle([plan])
    error = PhaseStepResult(phase=D, result=StepResult(step_id=2, time=2.0, error="boom"))
    [(_, result)] = router.handle([error])
    assert result == StepResult(step_id=2, time=2.0, error="decode executor: boom")
    # the scheduler failed a with the step: its token is not wanted
    assert router.handle([_answer(2, P, ("a", 9))]) == []
    assert router.joins.num_ahead == 0
