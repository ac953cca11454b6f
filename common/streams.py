"""Every Redis stream and key name, in one place."""

from __future__ import annotations

from typing import Final

# Clients append GenerateRequest here; batchers read it through BATCHER_GROUP and ack only finished ones.
REQUESTS_STREAM: Final = "llm:requests"
BATCHER_GROUP: Final = "batchers"

# Requests given up on (failed on BATCHER_MAX_DELIVERIES workers, or unreadable), kept for operators:
# the original entry's fields plus why it failed.
DEAD_LETTER_STREAM: Final = "llm:requests:dead"

# Everything addressed to the batcher: step results, aborts, worker hellos (XREAD, one reader).
BATCHER_INBOX: Final = "llm:batcher:inbox"

# worker_id -> encoded WorkerInfo, and worker_id -> last heartbeat (unix ms) as a sorted set.
WORKERS_HASH: Final = "llm:workers"
WORKERS_HEARTBEAT: Final = "llm:workers:heartbeat"

# Counters the batcher keeps (preemptions, steps, ...), a hash of integers.
BATCHER_STATS: Final = "llm:batcher:stats"
# Histograms and per-worker gauges for /metrics, a JSON MetricsSnapshot (common/metrics_schema.py).
BATCHER_METRICS: Final = "llm:batcher:metrics"
# One JSON StepTrace per scheduled step (common/trace_schema.py), for the gateway's dashboard; capped
# by an approximate MAXLEN (BATCHER_TRACE_MAXLEN): nothing reads it through a group, so no entry is pending.
BATCHER_TRACE: Final = "llm:batcher:trace"


# Sorted set req_id -> unix deadline: gateways keep the requests their clients follow alive here
# (refreshed every second); a client that leaves gets the resume window, a gateway that dies stops
# refreshing. The active batcher aborts requests whose deadline has passed (batcher/follow_deadlines.py).
FOLLOW_DEADLINES: Final = "llm:follow:leases"  # the key keeps its first name: old gateways share it


def token_stream(req_id: str) -> str:
    """Per-request stream of TokenEvent / RequestError; entry ids double as SSE ids."""
    return f"llm:tokens:{req_id}"


def request_meta(req_id: str) -> str:
    """Per-request hash the gateway writes at submit (how to render it, who owns it) for resuming
    clients and fetches by id; its TTL outlives the request plus its token stream's resume window."""
    return f"llm:request:{req_id}"


def worker_steps(worker_id: str) -> str:
    """Per-worker stream of SchedulerOutput, written by the batcher, read by that worker only."""
    return f"llm:worker:{worker_id}:steps"


def rate_limit_key(owner: str) -> str:
    """Per-owner rate-limit counters (a hash with a TTL), shared by every gateway."""
    return f"llm:ratelimit:{owner or '-'}"


# The active batcher's lease: "<epoch>:<batcher_id>", SET with a PX TTL and renewed while it runs;
# standby batchers wait for it to expire. Every step the batcher writes is fenced on it.
BATCHER_LEASE: Final = "llm:batcher:lease"
# Incremented on every takeover: the epoch stamped on steps (and echoed in results) of that leader.
BATCHER_EPOCH: Final = "llm:batcher:epoch"


def submitted_key(req_id: str) -> str:
    """Set (with a TTL) by `submit_once`: a retried client finds it and follows instead of resubmitting."""
    return f"llm:submitted:{req_id}"


def response_key(req_id: str) -> str:
    """Hash of a stored Responses API response (openai_frontend/responses_store.py), named after the
    request that generates it: `spec`, `status`, and `result` once it ended."""
    return f"llm:response:{req_id}"


def request_keys(req_id: str) -> tuple[str, ...]:
    """Every key named after one request; the batcher gives each the retention TTL when it ends."""
    return token_stream(req_id), request_meta(req_id), submitted_key(req_id), response_key(req_id)


# SCAN patterns matching the keys of `request_keys`, for operators and leftover checks.
REQUEST_KEY_PATTERNS: Final = ("llm:tokens:*", "llm:request:*", "llm:submitted:*", "llm:response:*")


# ----- OpenAI Files and Batch API (openai_frontend/files_store.py, batch_store.py) -----------------
def file_key(file_id: str) -> str:
    """Hash of one uploaded or generated file: `meta` (JSON) and `content` (bytes); TTL = its expiry."""
    return f"llm:file:{file_id}"


def owner_files(owner: str) -> str:
    """Sorted set of an API key's file ids, scored by creation time (for listing)."""
    return f"llm:files:{owner or '-'}"


def batch_key(batch_id: str) -> str:
    """Hash of one batch: `object` (its fixed fields, JSON), `status`, timestamps, file ids, `errors`."""
    return f"llm:batch:{batch_id}"


def owner_batches(owner: str) -> str:
    """Sorted set of an API key's batch ids, scored by creation time (for listing)."""
    return f"llm:batches:{owner or '-'}"


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
