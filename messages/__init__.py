"""Typed messages of the troupe graph: one module per receiving inbox, plus the trace codec.

This package imports nothing else of the project.
"""

from troupe.messages.admission import AdmissionInbox, RequestsEnded, TokenizedRequest
from troupe.messages.allocator import (
    AllocateBatch,
    AllocateNew,
    AllocatorInbox,
    AllocOp,
    CacheBlocks,
    Fork,
    FreeRequest,
    Grow,
    Shrink,
    SwapIn,
    SwapOut,
)
from troupe.messages.common import (
    ChatMessage,
    FinishReason,
    RejectCode,
    Timings,
    TokenLogprob,
    Usage,
)
from troupe.messages.events import (
    Aborted,
    ClientInbox,
    Delta,
    EngineStats,
    Failed,
    Finished,
    Rejected,
    StreamBatch,
    StreamEvent,
)
from troupe.messages.executor import ExecutorInbox, SeqWork, StepPlan, TokenMasks
from troupe.messages.grammar import ComputeMasks, GrammarInbox, GrammarRow, GrammarTokens
from troupe.messages.phase_router import Phase, PhaseRouterInbox, PhaseStepResult
from troupe.messages.sampling import ParamError, SamplingParams
from troupe.messages.scheduler import (
    AdmittedRequest,
    AllocationResult,
    FailedSeq,
    Grant,
    LateTokens,
    SampledToken,
    SchedulerInbox,
    SeqFailureReason,
    StepResult,
    StopRequests,
)
from troupe.messages.streamer import (
    RequestFailed,
    RequestOpened,
    RequestRejected,
    SeqOutput,
    StreamerInbox,
    TokenBatch,
)
from troupe.messages.structured import StructuredOutputs
from troupe.messages.tokenizer import AbortRequest, GenerateRequest, TokenizerInbox

__all__ = [
    "AbortRequest",
    "Aborted",
    "AdmissionInbox",
    "AdmittedRequest",
    "AllocOp",
    "AllocateBatch",
    "AllocateNew",
    "AllocationResult",
    "AllocatorInbox",
    "CacheBlocks",
    "ChatMessage",
    "ClientInbox",
    "ComputeMasks",
    "Delta",
    "EngineStats",
    "ExecutorInbox",
    "Failed",
    "FailedSeq",
    "FinishReason",
    "Finished",
    "Fork",
    "FreeRequest",
    "GenerateRequest",
    "GrammarInbox",
    "GrammarRow",
    "GrammarTokens",
    "Grant",
    "Grow",
    "LateTokens",
    "ParamError",
    "Phase",
    "PhaseRouterInbox",
    "PhaseStepResult",
    "RejectCode",
    "Rejected",
    "RequestFailed",
    "RequestOpened",
    "RequestRejected",
    "RequestsEnded",
    "SampledToken",
    "SamplingParams",
    "SchedulerInbox",
    "SeqFailureReason",
    "SeqOutput",
    "SeqWork",
    "Shrink",
    "StepPlan",
    "StepResult",
    "StopRequests",
    "StreamBatch",
    "StreamEvent",
    "StreamerInbox",
    "StructuredOutputs",
    "SwapIn",
    "SwapOut",
    "Timings",
    "TokenBatch",
    "TokenLogprob",
    "TokenMasks",
    "TokenizedRequest",
    "TokenizerInbox",
    "Usage",
]
