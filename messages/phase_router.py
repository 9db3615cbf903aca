"""Inbox of the PhaseRouter (prefill/decode disaggregation): the scheduler's StepPlans and
each executor's StepResult, tagged with the executor that computed it.

    Scheduler ── StepPlan N ──► PhaseRouter ── StepPlan N (chunks, send_blocks) ──► prefill
                                    │      └── StepPlan N (decodes, recv_blocks) ──► executor
    Scheduler ◄── StepResult N ─────┘ ◄── PhaseStepResult(prefill | decode, StepResult N) ──┘
"""

from __future__ import annotations

import enum

import msgspec
from troupe.messages.executor import StepPlan
from troupe.messages.scheduler import StepResult


class Phase(enum.StrEnum):
    """Which executor: prompts are computed on one, their continuations on the other."""

    PREFILL = "prefill"
    DECODE = "decode"


class PhaseStepResult(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """One executor's answer to its share of step `result.step_id`."""

    phase: Phase
    result: StepResult


PhaseRouterInbox = StepPlan | PhaseStepResult
