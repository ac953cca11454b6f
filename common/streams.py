"""Every Redis stream and key name, in one place.

Keys are laid out for Redis Cluster (docs/architecture.md, *Cells*): every key of a cell, and of a
request placed in it, carries the cell's hash tag (`llm:{<cell>}:...`), so each script, transaction
and multi-key read stays in one slot. A request's cell is part of its id (`<cell>~<rest>`; an id
without one is in the default cell), so any gateway finds a request's keys from its id alone.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final

DEFAULT_CELL: Final = "default"
# Lower-case letters, digits and '-': no '{', '}' (they would end the hash tag) nor the separator.
_CELL_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
_CELL_SEP: Final = "~"
BATCHER_GROUP: Final = "batchers"


def check_cell(cell: str) -> str:
    """`cell` when it is a valid cell name; ValueError saying what one is otherwise."""
    if not _CELL_NAME.match(cell):
        raise ValueError(f"cell name {cell!r} must be 1-32 of a-z 0-9 - (starting with a letter or digit)")
    return cell


def cell_of(req_id: str) -> str:
    """The cell a request was placed in: the prefix of `<cell>~<rest>`, else the default cell."""
    cell, sep, rest = req_id.partition(_CELL_SEP)
    return cell if sep and rest and _CELL_NAME.match(cell) else DEFAULT_CELL


def placed_req_id(cell: str, req_id: str) -> str:
    """`req_id` placed in `cell`: default-cell ids stay as they are, others carry the cell."""
    return req_id if cell == DEFAULT_CELL else f"{check_cell(cell)}{_CELL_SEP}{req_id}"


def _tag(cell: str) -> str:
    return f"llm:{{{cell}}}"


@dataclass(frozen=True, slots=True)
class CellKeys:
    """The keys of one cell (one active batcher, its standbys and its workers), all in one slot."""

    cell: str
    # Clients append GenerateRequest here; the batcher reads it through BATCHER_GROUP, acks finished ones.
    requests: str
    # Requests given up on (failed on BATCHER_MAX_DELIVERIES workers, or unreadable), for operators:
    # the original entry's fields plus why it failed.
    dead_letter: str
    # Everything addressed to the batcher: step results, aborts, worker hellos (XREAD, one reader).
    inbox: str
    # worker_id -> encoded WorkerInfo (the worker's write permit), and worker_id -> last beat (unix ms).
    workers: str
    heartbeat: str
    # Counters the batcher keeps (preemptions, steps, ...), a hash of integers.
    stats: str
    # Histograms and per-worker gauges for /metrics, a JSON MetricsSnapshot (common/metrics_schema.py).
    metrics: str
    # One JSON StepTrace per scheduled step (common/trace_schema.py) for the dashboard; capped by an
    # approximate MAXLEN (BATCHER_TRACE_MAXLEN): nothing reads it through a group, so nothing is pending.
    trace: str
    # Sorted set req_id -> unix deadline: gateways keep the requests their clients follow alive here
    # (refreshed every second); a client that leaves gets the resume window, a gateway that dies stops
    # refreshing. The cell's batcher aborts requests whose deadline has passed
    # (batcher/service/follow_deadlines.py).
    follow_deadlines: str
    # The active batcher's lease "<epoch>:<batcher_id>" (SET PX, renewed); standbys wait for it to
    # expire. Every step the batcher writes is fenced on it.
    lease: str
    # Incremented on every takeover: the epoch stamped on steps (and echoed in results) of that leader.
    epoch: str
    # One entry per token stream that got its last event (field `s`: the stream's key), appended in
    # the same write: gateways wake a non-streaming follower only at its end (vLLM's FINAL_ONLY).
    ended_streams: str

    def worker_steps(self, worker_id: str) -> str:
        """Per-worker stream of SchedulerOutput, written by the batcher, read by that worker only."""
        return f"{_tag(self.cell)}:worker:{worker_id}:steps"

    def gateway_health(self) -> str:
        """A key every gateway's /health writes (SET PX): does Redis take writes (not full, not read-only)?"""
        return f"{_tag(self.cell)}:gateway:health"

    def gateway_wake(self, gateway_id: str) -> str:
        """A gateway's own small stream that wakes its shared token-stream read of this cell (TTL)."""
        return f"{_tag(self.cell)}:gateway:wake:{gateway_id}"


@functools.cache
def cell_keys(cell: str = DEFAULT_CELL) -> CellKeys:
    t = _tag(check_cell(cell))
    return CellKeys(
        cell=cell,
        requests=f"{t}:requests",
        dead_letter=f"{t}:requests:dead",
        inbox=f"{t}:batcher:inbox",
        workers=f"{t}:workers",
        heartbeat=f"{t}:workers:heartbeat",
        stats=f"{t}:batcher:stats",
        metrics=f"{t}:batcher:metrics",
        trace=f"{t}:batcher:trace",
        follow_deadlines=f"{t}:follow:deadlines",
        lease=f"{t}:batcher:lease",
        epoch=f"{t}:batcher:epoch",
        ended_streams=f"{t}:ended-streams",
    )


# The default cell's keys under their historical constant names, for tools and tests that speak to a
# single-cell deployment; services take their cell's keys from `cell_keys(settings.cell)`.
_DEFAULT = cell_keys(DEFAULT_CELL)
REQUESTS_STREAM: Final = _DEFAULT.requests
DEAD_LETTER_STREAM: Final = _DEFAULT.dead_letter
BATCHER_INBOX: Final = _DEFAULT.inbox
WORKERS_HASH: Final = _DEFAULT.workers
WORKERS_HEARTBEAT: Final = _DEFAULT.heartbeat
BATCHER_STATS: Final = _DEFAULT.stats
BATCHER_METRICS: Final = _DEFAULT.metrics
BATCHER_TRACE: Final = _DEFAULT.trace
FOLLOW_DEADLINES: Final = _DEFAULT.follow_deadlines
BATCHER_LEASE: Final = _DEFAULT.lease
BATCHER_EPOCH: Final = _DEFAULT.epoch
ENDED_STREAMS: Final = _DEFAULT.ended_streams


def worker_steps(worker_id: str) -> str:
    """The default cell's steps stream of `worker_id` (see CellKeys.worker_steps)."""
    return _DEFAULT.worker_steps(worker_id)


# ----- keys of one request: in its cell's slot, found from its id alone ----------------------------
def token_stream(req_id: str) -> str:
    """Per-request stream of TokenEvent / RequestError; entry ids double as SSE ids."""
    return f"{_tag(cell_of(req_id))}:tokens:{req_id}"


def request_meta(req_id: str) -> str:
    """Per-request hash the gateway writes at submit (how to render it, who owns it) for resuming
    clients and fetches by id; its TTL outlives the request plus its token stream's resume window."""
    return f"{_tag(cell_of(req_id))}:request:{req_id}"


def submitted_key(req_id: str) -> str:
    """Set (with a TTL) by `submit_once`: a retried client finds it and follows instead of resubmitting."""
    return f"{_tag(cell_of(req_id))}:submitted:{req_id}"


def response_key(req_id: str) -> str:
    """Hash of a stored Responses API response (openai_frontend/responses/store.py), named after the
    request that generates it: `spec`, `status`, and `result` once it ended."""
    return f"{_tag(cell_of(req_id))}:response:{req_id}"


def request_keys(req_id: str) -> tuple[str, ...]:
    """Every key named after one request; the batcher gives each the retention TTL when it ends."""
    return token_stream(req_id), request_meta(req_id), submitted_key(req_id), response_key(req_id)


# SCAN patterns matching the keys of `request_keys` in every cell, for operators and leftover checks.
REQUEST_KEY_PATTERNS: Final = (
    "llm:{*}:tokens:*",
    "llm:{*}:request:*",
    "llm:{*}:submitted:*",
    "llm:{*}:response:*",
)


# ----- keys of no cell -------------------------------------------------------------------------------
def rate_limit_key(owner: str) -> str:
    """Per-owner rate-limit counters (a hash with a TTL), shared by every gateway. One key per call,
    so no tag: owners spread over the cluster's slots."""
    return f"llm:ratelimit:{owner or '-'}"


# The Files and Batch APIs share one hash tag: their writes are transactions over a file or batch and
# its owner's index, and a batch copies its input file in one script. They are a control plane (a few
# calls per batch, not per token), so one slot carries them.
_API: Final = "llm:{api}"

# Every cell's batcher scores its cell here (unix seconds) at each worker check (0.5 s): a gateway
# with GATEWAY_CELLS=* places requests in the cells seen lately, so a cell started at run time takes
# traffic within seconds and one whose batchers are all gone stops receiving it.
CELLS_REGISTRY: Final = f"{_API}:cells"

# Hash: LoRA adapter name -> its LoadedAdapter (msgpack; openai_frontend/model/lora_registry.py). One
# for the deployment: an adapter's name is a `model` name, unique across every base model and gateway.
LORA_ADAPTERS: Final = f"{_API}:lora-adapters"


def file_key(file_id: str) -> str:
    """Hash of one uploaded or generated file: `meta` (JSON) and `content` (bytes); TTL = its expiry."""
    return f"{_API}:file:{file_id}"


def owner_files(owner: str) -> str:
    """Sorted set of an API key's file ids, scored by creation time (for listing)."""
    return f"{_API}:files:{owner or '-'}"


def stored_chat_key(completion_id: str) -> str:
    """Hash of a stored chat completion (`store: true`): the answer, its messages, its metadata."""
    return f"{_API}:chatcmpl:{completion_id}"


def owner_stored_chats(owner: str) -> str:
    """Sorted set of an API key's stored chat completion ids, scored by creation time (for listing)."""
    return f"{_API}:chatcmpls:{owner or '-'}"


def batch_key(batch_id: str) -> str:
    """Hash of one batch: `object` (its fixed fields, JSON), `status`, timestamps, file ids, `errors`."""
    return f"{_API}:batch:{batch_id}"


def owner_batches(owner: str) -> str:
    """Sorted set of an API key's batch ids, scored by creation time (for listing)."""
    return f"{_API}:batches:{owner or '-'}"


def batch_input(batch_id: str) -> str:
    """The batch's copy of its input file's content, taken at creation (the file may be deleted)."""
    return f"{batch_key(batch_id)}:input"


def batch_outputs(batch_id: str) -> str:
    """Hash: line index -> the output line of a request that succeeded (the output file, unassembled)."""
    return f"{batch_key(batch_id)}:out"


def batch_errors(batch_id: str) -> str:
    """Hash: line index -> the error line of a request that failed (the error file, unassembled)."""
    return f"{batch_key(batch_id)}:err"


def batch_attempts(batch_id: str) -> str:
    """Hash: line index -> how many times its result was lost and it was submitted again (usually absent)."""
    return f"{batch_key(batch_id)}:attempts"


def batch_claim(batch_id: str) -> str:
    """The claim of the one Celery task running the batch now (a token with a PX TTL, renewed)."""
    return f"{batch_key(batch_id)}:runner"


# The batch reaper's keys (cbserve_celery/batch_reaper.py); `batches-` so no owner's index can clash.
# Sorted set: the ids of batches not yet seen ended, scored by creation time.
ACTIVE_BATCHES: Final = f"{_API}:batches-active"
# Hash: batch id -> when a reaper pass first found no task holding it (unix seconds).
ORPHANED_BATCHES: Final = f"{_API}:batches-orphaned"
# One reaper pass per interval across all Celery workers: whoever sets this key (NX, PX) does it.
BATCH_REAPER_TURN: Final = f"{_API}:batches-reaper"
