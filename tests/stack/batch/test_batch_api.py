"""The OpenAI Batch API with the real `openai` SDK against the real stack and a real Celery worker.

One stack serves the module: Redis, a batcher with room for only two requests per step (so batch
lines queue up in it), a worker, a gateway with two API keys, and a `celery worker` process that runs
`cbserve.run_batch`. Each line's output body must equal what the interactive endpoint answers for the
same body (greedy), and each failing line the endpoint's own error answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import redis.asyncio as aioredis
from openai.types import Batch, FileObject

from common.protocol import FIELD, GenerateRequest, SamplingParams, TokenEvent, decode_event, decode_request
from common.redis_io.result_lost import result_lost
from common.stream_client import follow, submit_once
from common.streams import REQUESTS_STREAM, token_stream
from gateway.security.api_keys import hash_key
from harness.load.batch_runs import jsonl, request_line
from harness.processes.services import ROOT, Stack, running_stack, wait_for
from harness.user.readme_examples import example, run_example

KEY_A, KEY_B = "sk-batch-a", "sk-batch-b"
MAX_FILE_BYTES = 256 * 1024
FINAL = ("completed", "failed", "expired", "cancelled")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Stack]:
    # A queue bound below the number of batch lines that wait: they must not make it refuse
    # interactive requests.
    with running_stack(
        tmp_path_factory.mktemp("batch-api"),
        tiny_model_dir,
        batcher_env={"BATCHER_MAX_NUM_SEQS": "2"},
        celery_env={"CBSERVE_CELERY_BATCH_MAX_LINES_IN_FLIGHT": "8"},
        GATEWAY_API_KEY_HASHES=f"alice:{hash_key(KEY_A)},bob:{hash_key(KEY_B)}",
        GATEWAY_MAX_FILE_BYTES=str(MAX_FILE_BYTES),
        GATEWAY_MAX_QUEUED_REQUESTS="4",
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def alice(stack: Stack) -> Iterator[openai.OpenAI]:
    with stack.sdk(KEY_A, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def bob(stack: Stack) -> Iterator[openai.OpenAI]:
    with stack.sdk(KEY_B, timeout=60) as client:
        yield client


def run_batch(
    client: openai.OpenAI, lines: list[dict[str, Any]], endpoint: str = "/v1/chat/completions"
) -> Batch:
    upload = client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id,
        endpoint=endpoint,
        completion_window="24h",
        metadata={"job": "test"},  # type: ignore[arg-type]
    )
    return wait_final(client, batch.id)


def wait_final(client: openai.OpenAI, batch_id: str, timeout: float = 120) -> Batch:
    batch: list[Batch] = []

    def final() -> bool:
        batch[:] = [client.batches.retrieve(batch_id)]
        return batch[0].status in FINAL

    wait_for(final, timeout, f"batch {batch_id} to end", interval=0.1)
    return batch[0]


def file_lines(client: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    assert file_id is not None
    return {
        line["custom_id"]: line for line in map(json.loads, client.files.content(file_id).text.splitlines())
    }


def interactive(stack: Stack, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """What the endpoint answers for `body` sent alone."""
    response = httpx.post(
        f"{stack.base_url}{path}", json=body, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=60
    )
    return response.status_code, response.json()


def same_body(got: Any, expected: Any, at: str = "body") -> None:
    """Equal but for `id` and `created`; logprobs may differ in float noise (another batch, other sums),
    and cached prompt tokens with what the earlier of two equal prompts left in the prefix cache."""
    if at == "body.usage.prompt_tokens_details":
        return
    if isinstance(expected, float):
        assert got == pytest.approx(expected, abs=1e-4), at
    elif isinstance(expected, dict):
        keys = set(expected) - {"id", "created"} if at == "body" else set(expected)
        assert set(got) - {"id", "created"} == keys if at == "body" else set(got) == keys, at
        for key in keys:
            same_body(got[key], expected[key], f"{at}.{key}")
    elif isinstance(expected, list):
        assert len(got) == len(expected), at
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            same_body(g, e, f"{at}[{i}]")
    else:
        assert got == expected, at


CHAT_BODIES = {
    "plain": {
        "messages": [{"role": "user", "content": "Return the value."}],
        "max_tokens": 12,
        "temperature": 0,
    },
    "two-choices": {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}],
        "max_tokens": 8,
        "temperature": 0,
        "n": 2,
        "return_token_ids": True,
    },
    "stop-string": {  # its `stop` is a piece of what it writes without one (see the test)
        "messages": [{"role": "user", "content": "Explain the object."}],
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
    },
    "logprobs": {
        "messages": [{"role": "user", "content": "A list of values"}],
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    },
}


def test_sdk_round_trip_gives_the_interactive_endpoints_bodies(stack: Stack, alice: openai.OpenAI) -> None:
    unstopped = interactive(stack, "/v1/chat/completions", CHAT_BODIES["stop-string"])[1]
    text = unstopped["choices"][0]["message"]["content"]
    assert len(text) > 8
    CHAT_BODIES["stop-string"]["stop"] = [text[6:8]]
    lines = [request_line(cid, body) for cid, body in CHAT_BODIES.items()]
    batch = run_batch(alice, lines)
    assert isinstance(batch, Batch) and batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        4,
        4,
        0,
    )
    assert batch.error_file_id is None and batch.metadata == {"job": "test"}
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert batch.expires_at == batch.created_at + 24 * 3600

    results = file_lines(alice, batch.output_file_id)
    assert set(results) == set(CHAT_BODIES)
    for custom_id, body in CHAT_BODIES.items():
        line = results[custom_id]
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert line["id"].startswith("batch_req_") and line["response"]["request_id"]
        status, expected = interactive(stack, "/v1/chat/completions", body)
        assert status == 200
        same_body(line["response"]["body"], expected)
    assert results["stop-string"]["response"]["body"]["choices"][0]["finish_reason"] == "stop"

    output = alice.files.retrieve(batch.output_file_id)  # type: ignore[arg-type]
    assert isinstance(output, FileObject) and output.purpose == "batch_output"
    assert output.bytes == len(alice.files.content(output.id).content)
    assert batch.id in [b.id for b in alice.batches.list()]
    assert {batch.input_file_id, output.id} <= {f.id for f in alice.files.list()}
    assert [f.id for f in alice.files.list(purpose="batch_output")] == [output.id]


def test_completions_batch_and_lines_that_fail_as_the_endpoint_would(
    stack: Stack, alice: openai.OpenAI
) -> None:
    bodies = {
        "ok": {"prompt": [5, 6, 7, 8], "max_tokens": 10, "temperature": 0, "echo": True},
        "too-hot": {"prompt": "hello", "max_tokens": 4, "temperature": 9},
        "other-model": {"prompt": "hello", "model": "gpt-4o"},
        "no-prompt": {"max_tokens": 4},
        "streamed": {"prompt": "hello", "stream": True},
    }
    lines = [request_line(cid, body, "/v1/completions") for cid, body in bodies.items()]
    batch = run_batch(alice, lines, "/v1/completions")
    assert batch.status == "completed" and batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 4)
    ok = file_lines(alice, batch.output_file_id)["ok"]["response"]
    same_body(ok["body"], interactive(stack, "/v1/completions", bodies["ok"])[1])
    errors = file_lines(alice, batch.error_file_id)
    assert set(errors) == {"too-hot", "other-model", "no-prompt", "streamed"}
    for custom_id in ("too-hot", "other-model", "no-prompt"):
        status, expected = interactive(stack, "/v1/completions", bodies[custom_id])
        response = errors[custom_id]["response"]
        assert (response["status_code"], response["body"]) == (status, expected), custom_id
    assert [errors[c]["response"]["status_code"] for c in ("too-hot", "other-model", "no-prompt")] == [
        400,
        404,
        400,
    ]
    assert errors["streamed"]["response"]["body"]["error"]["param"] == "stream"


def test_a_stored_chat_line_is_refused_by_name(alice: openai.OpenAI) -> None:
    """store: true asks for a stored chat completion, which a batch line does not make: refused."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "store": True}
    batch = run_batch(alice, [request_line("stored", body)])
    assert batch.request_counts is not None and batch.request_counts.failed == 1
    error = file_lines(alice, batch.error_file_id)["stored"]["response"]
    assert error["status_code"] == 400 and error["body"]["error"]["param"] == "store"


def test_malformed_input_file_fails_the_batch_with_line_errors(alice: openai.OpenAI) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    content = (
        json.dumps(request_line("a", body))
        + "\n{not json\n\n"
        + json.dumps(request_line("a", body))
        + "\n"
        + json.dumps(request_line("c", body, "/v1/completions"))
        + "\n"
        + json.dumps({"custom_id": "d", "method": "GET", "url": "/v1/chat/completions", "body": body})
        + "\n"
    )
    upload = alice.files.create(file=("bad.jsonl", content.encode()), purpose="batch")
    batch = alice.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_final(alice, batch.id)
    assert batch.status == "failed" and batch.failed_at and batch.errors and batch.errors.data
    found = [(e.line, e.code, e.param) for e in batch.errors.data]
    assert found == [
        (2, "invalid_json_line", None),
        (4, "duplicate_custom_id", "custom_id"),
        (5, "mismatched_url", "url"),
        (6, "invalid_request", "method"),
    ]
    assert batch.output_file_id is None and batch.error_file_id is None


def test_a_line_nested_50k_deep_fails_the_batch_instead_of_hanging(alice: openai.OpenAI) -> None:
    """Before the bound (openai_frontend/batch/input.py) the task died in RecursionError and the batch
    stayed `validating` for good."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    deep = '{"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", "body": {"x": '
    content = json.dumps(request_line("a", body)) + "\n" + deep + "[" * 50_000 + "]" * 50_000 + "}}\n"
    upload = alice.files.create(file=("deep.jsonl", content.encode()), purpose="batch")
    batch = alice.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_final(alice, batch.id, timeout=60)
    assert batch.status == "failed" and batch.errors and batch.errors.data, batch
    [error] = batch.errors.data
    assert (error.line, error.code) == (2, "invalid_request") and "deeper than" in (error.message or "")


def test_uploads_and_batch_creation_are_checked(stack: Stack, alice: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as too_big:
        alice.files.create(file=("big.jsonl", b"x" * (MAX_FILE_BYTES + 1)), purpose="batch")
    assert too_big.value.status_code == 413
    with pytest.raises(openai.BadRequestError, match="purpose"):
        alice.files.create(file=("a.jsonl", b"{}\n"), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError, match="empty"):
        alice.files.create(file=("a.jsonl", b"\n\n"), purpose="batch")
    upload = alice.files.create(
        file=("a.jsonl", jsonl([request_line("x", {"prompt": "a"})])), purpose="batch"
    )
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        alice.batches.create(input_file_id=upload.id, endpoint="/v1/moderations", completion_window="24h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        alice.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        alice.batches.create(input_file_id="file-nope", endpoint="/v1/completions", completion_window="24h")
    assert alice.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(upload.id)


def test_files_and_batches_are_visible_only_to_their_key(alice: openai.OpenAI, bob: openai.OpenAI) -> None:
    lines = [request_line("only", {"prompt": [1, 2, 3], "max_tokens": 2}, "/v1/completions")]
    batch = run_batch(alice, lines, "/v1/completions")
    assert batch.status == "completed" and batch.output_file_id
    for file_id in (batch.input_file_id, batch.output_file_id):
        with pytest.raises(openai.NotFoundError):
            bob.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            bob.files.content(file_id)
        with pytest.raises(openai.NotFoundError):
            bob.files.delete(file_id)
    with pytest.raises(openai.NotFoundError):
        bob.batches.create(
            input_file_id=batch.input_file_id, endpoint="/v1/completions", completion_window="24h"
        )
    with pytest.raises(openai.NotFoundError):
        bob.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        bob.batches.cancel(batch.id)
    assert batch.id not in [b.id for b in bob.batches.list()]
    assert not {batch.input_file_id, batch.output_file_id} & {f.id for f in bob.files.list()}
    assert alice.files.retrieve(batch.output_file_id).id == batch.output_file_id  # still there for alice


def test_cancel_aborts_the_lines_in_flight(stack: Stack, alice: openai.OpenAI) -> None:
    body = {"prompt": [9, 8, 7], "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    lines = [request_line(f"long-{i}", body, "/v1/completions") for i in range(12)]
    upload = alice.files.create(file=("long.jsonl", jsonl(lines)), purpose="batch")
    batch = alice.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    r = redis.Redis.from_url(stack.redis_url)
    wait_for(lambda: r.xlen(token_stream(f"{batch.id}-0")) >= 5, 60, "the first line to generate")
    cancelling = alice.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    batch = wait_final(alice, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at and batch.request_counts is not None
    assert batch.request_counts.total == 12

    # The 8 lines in flight were aborted: the batcher lets go of them, each well short of max_tokens
    # (the two running wrote a few tokens, the six waiting none), and the other 4 never started. A
    # running line may reach its last token before its abort lands: then it counts as completed.
    def idle() -> bool:
        stats = stack.stats()
        return stats.get("num_running") == 0 and stats.get("num_waiting") == 0

    wait_for(idle, 30, "the batcher to let go of the aborted lines")
    submitted = [decode_request(f[FIELD]).req_id for _, f in r.xrange(REQUESTS_STREAM)]
    lines_run = [req_id for req_id in submitted if req_id.startswith(batch.id)]
    assert len(lines_run) == 8
    ends = {
        req_id: [decode_event(f[FIELD]) for _, f in r.xrange(token_stream(req_id))] for req_id in lines_run
    }
    finished = {req_id for req_id, events in ends.items() if _finished_normally(events)}
    aborted = set(lines_run) - finished
    assert len(aborted) >= 6 and all(len(ends[req_id]) < 400 for req_id in aborted), ends
    assert batch.request_counts.completed == len(finished)
    if finished:
        assert batch.output_file_id
        output = [json.loads(x) for x in alice.files.content(batch.output_file_id).text.splitlines()]
        assert {o["response"]["request_id"] for o in output} == finished
    with pytest.raises(openai.ConflictError):
        alice.batches.cancel(batch.id)


def test_interactive_request_is_admitted_ahead_of_waiting_batch_lines(
    stack: Stack, alice: openai.OpenAI
) -> None:
    """The batcher has two slots; eight batch lines are submitted at once, so six wait. An interactive
    request that arrives then is not refused by the queue bound (4) and is scheduled before those
    waiting lines (FIFO would put it last)."""
    r = redis.Redis.from_url(stack.redis_url)
    body = {"prompt": [3, 4, 5], "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    lines = [request_line(f"bulk-{i}", body, "/v1/completions") for i in range(8)]
    upload = alice.files.create(file=("bulk.jsonl", jsonl(lines)), purpose="batch")
    batch = alice.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    wait_for(lambda: stack.stats().get("num_waiting", 0) >= 5, 60, "batch lines to wait in the batcher")
    with httpx.stream(
        "POST",
        f"{stack.base_url}/v1/completions",
        json={"prompt": [7, 7, 7], "max_tokens": 4, "temperature": 0, "stream": True},
        headers={"Authorization": f"Bearer {KEY_A}"},
        timeout=60,
    ) as response:
        interactive_id = response.headers["x-request-id"]
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and '"finish_reason":"length"' in events[-2]
    assert wait_final(alice, batch.id).status == "completed"

    # Arrival order (the requests stream) against the order of first tokens: a first token comes
    # from the step that admitted its request, and Redis stamps entries with its clock (ms), so a line
    # admitted steps after the interactive request has a later first entry id than it.
    arrival = [decode_request(f[FIELD]).req_id for _, f in r.xrange(REQUESTS_STREAM)]

    def first_token_ms(req_id: str) -> int:
        [(entry_id, _)] = r.xrange(token_stream(req_id), count=1)
        return int(entry_id.split(b"-")[0])

    lines_before = [i for i in arrival[: arrival.index(interactive_id)] if i.startswith(batch.id)]
    overtaken = [i for i in lines_before if first_token_ms(i) > first_token_ms(interactive_id)]
    assert len(lines_before) == 8 and len(overtaken) >= 3, (lines_before, overtaken)


def test_readme_batch_example_runs_verbatim(stack: Stack) -> None:
    code = example(ROOT / "README.md", "batch-api")
    out = run_example(code, {"CBSERVE_URL": stack.base_url, "CBSERVE_API_KEY": KEY_A})
    expected = "completed BatchRequestCounts(completed=2, failed=0, total=2)\n"
    for i, question in enumerate(["What is the assert statement?", "Explain the for statement."]):
        body = {"messages": [{"role": "user", "content": question}], "max_tokens": 32, "temperature": 0}
        content = interactive(stack, "/v1/chat/completions", body)[1]["choices"][0]["message"]["content"]
        expected += f"question-{i} {content}\n"
    assert out == expected


def test_a_finished_request_whose_stream_expired_counts_as_lost(stack: Stack) -> None:
    """What a batch task that comes back hours after a crash relies on to run a line again."""
    r = redis.Redis.from_url(stack.redis_url)
    request = GenerateRequest(
        req_id=f"lost-{time.time()}",
        prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(max_tokens=3, temperature=0.0),
        arrival_time=time.time(),
    )
    assert submit_once(r, request) and not submit_once(r, request)
    assert len(list(follow(r, request.req_id, timeout_s=60))) == 3

    async def lost() -> bool:
        client = aioredis.Redis.from_url(stack.redis_url)
        try:
            return await result_lost(client, request.req_id)
        finally:
            await client.aclose()

    assert not asyncio.run(lost())  # finished, its stream still readable
    wait_for(lambda: stack.stats().get("num_running") == 0, 30, "the batcher to acknowledge it")
    r.delete(token_stream(request.req_id))  # as its TTL would, 15 minutes after the end
    assert asyncio.run(lost())


def _finished_normally(events: list[Any]) -> bool:
    return any(isinstance(e, TokenEvent) and e.finish_reason == "length" for e in events)
