"""Images in the step's budget (vLLM's `Scheduler._try_schedule_encoder_inputs`). No I/O.

A prefill chunk that reaches an image's placeholder tokens makes the worker run the vision encoder on
that image (unless its encoder cache has it): each step has an encoder budget in embedding tokens
(BATCHER_MAX_NUM_ENCODER_INPUT_TOKENS, default the worker's max_num_batched_tokens), so one request
with many images cannot stall a step. A chunk whose next image does not fit what is left stops
before that image; the first image of a step always fits, however large, so nothing waits forever.

A worker whose model attends bidirectionally within an image (Gemma 3: `disable_chunked_mm_input`,
vLLM's name) never gets an image's run split across chunks: the chunk stops before the image when
the whole run does not fit, unless the run is longer than any step's budget.
"""

from __future__ import annotations

from batcher.core.policies.interface import StepDraft
from batcher.core.request import Request
from batcher.core.worker_state import WorkerState


def fit_mm_chunk(ws: WorkerState, req: Request, start: int, num_new: int, step: StepDraft, anew: bool) -> int:
    """`num_new` tokens from `start` cut to what the step's encoder budget and the worker's image
    rule allow, the encoder work counted in `step`; `anew`: the request is admitted in this step
    (an image begun in an earlier chunk is encoded again then: its new worker may lack it)."""
    if not req.mm_features or num_new <= 0:
        return num_new
    end = start + num_new
    cost = 0
    for feature in sorted(req.mm_features, key=lambda f: f.mm_position.offset):
        offset, length = feature.mm_position.offset, feature.mm_position.length
        if offset + length <= start or offset >= end:
            continue
        if offset < start and not anew:
            continue  # encoded by an earlier chunk on this worker: in its cache
        whole = ws.info.disable_chunked_mm_input and length <= ws.max_num_batched_tokens
        if whole and offset + length > end and offset >= start:
            end = offset  # its whole run in a later step
            break
        spent = step.num_encoder_tokens + cost
        if spent and spent + length > step.encoder_budget:
            end = max(offset, start)  # stop before it: a later step encodes it
            break
        cost += length
    step.num_encoder_tokens += cost if end > start else 0
    return end - start
