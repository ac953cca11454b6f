"""What a scheduling policy is: it fills one worker's step. No I/O.

The policy is chosen once from the setting (step_scheduler.py's `make_policy`); each one fills a
`StepDraft` from the scheduler's state, and step_scheduler.py turns the draft into the step sent.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from batcher.core.request import Request
from batcher.core.scheduler_state import SchedulerState
from batcher.core.worker_state import WorkerState
from common.protocol import CachedRequestData, NewRequestData


@dataclass(slots=True)
class StepDraft:
    """A step being filled by a policy: what each request computes, and requests failed meanwhile."""

    num_scheduled: dict[str, int] = field(default_factory=dict)  # req_id -> tokens this step
    cached: list[CachedRequestData] = field(default_factory=list)  # running ones, continued
    new: list[NewRequestData] = field(default_factory=list)  # admitted now
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)  # req_id -> its drafts
    draft_after: dict[str, int] = field(default_factory=dict)  # req_id -> drafts its worker makes next
    encoder_budget: int = 0  # image embeddings the worker may encode in this step (multimodal.py)
    num_encoder_tokens: int = 0  # of which the step's chunks use
    failed: list[Request] = field(default_factory=list)


class SchedulingPolicy(ABC):
    @abstractmethod
    def schedule(self, state: SchedulerState, ws: WorkerState, step: StepDraft) -> None:
        """Fill `step` for worker `ws`: continue running requests, admit waiting ones."""
