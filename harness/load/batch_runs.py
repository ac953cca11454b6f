"""Batch API input files, and a run for fault tests: submit N greedy completion lines, see it part
done, check that each line's request was submitted exactly once (its id derives from batch and line)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import openai
import redis

from common.protocol import FIELD, decode_request
from common.streams import REQUESTS_STREAM, batch_outputs, submitted_key
from harness.load.load_clients import completion_body


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    """A Batch API input file's content: one JSON line each."""
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def request_line(custom_id: str, body: dict[str, Any], url: str = "/v1/chat/completions") -> dict[str, Any]:
    """One line of a Batch API input file."""
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def completion_lines(
    models: Iterable[str], prompts: list[list[int]], max_tokens: int
) -> list[dict[str, Any]]:
    """Greedy /v1/completions lines of each prompt on each model, custom ids `{model}-{prompt index}`."""
    return [
        request_line(
            f"{model}-{i}",
            {**completion_body(p, max_tokens, stream=False), "model": model},
            "/v1/completions",
        )
        for model in models
        for i, p in enumerate(prompts)
    ]


def submit_batch(base_url: str, num_lines: int, max_tokens: int) -> tuple[openai.OpenAI, str, list[str]]:
    """(an SDK client, the batch id, the request id of each line) of a new batch."""
    body = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    lines = [
        request_line(f"line-{i}", {"prompt": [i + 1, 7, 9], **body}, "/v1/completions")
        for i in range(num_lines)
    ]
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", timeout=60, max_retries=0)
    upload = client.files.create(file=("lines.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h"
    )
    return client, batch.id, [f"{batch.id}-{i}" for i in range(num_lines)]


def part_done(r: redis.Redis, batch_id: str, req_ids: list[str], at_least: int = 2) -> Callable[[], bool]:
    """A condition: `at_least` lines done, not all, and some submitted that are not done yet."""

    def check() -> bool:
        num_done: Any = r.hlen(batch_outputs(batch_id))
        num_submitted = sum(int(r.exists(submitted_key(i))) for i in req_ids)
        return at_least <= num_done < len(req_ids) and num_submitted > num_done

    return check


def check_submitted_once(r: redis.Redis, batch_id: str, req_ids: list[str]) -> None:
    entries: Any = r.xrange(REQUESTS_STREAM)
    submitted = [decode_request(fields[FIELD]).req_id for _, fields in entries]
    assert sorted(i for i in submitted if i.startswith(batch_id)) == sorted(req_ids)
