"""One API key cannot store more than its quota of files, nor keep more batches in flight than its
quota; another key is not affected, and a key gets room back by deleting or cancelling.

Before, any key could upload file after file (five 60 MB uploads all answered 200, Redis from 245 to
588 MB, kept 30 days) and queue batches without bound.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx

from gateway.security.api_keys import hash_key
from harness.gateway.gateway_server import RunningGateway

ALICE, BOB = "sk-alice-quota", "sk-bob-quota"
BODY = {"prompt": "hi", "max_tokens": 1}
LINE = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": BODY}


def _upload(gateway: RunningGateway, key: str, num_lines: int = 1) -> httpx.Response:
    content = "\n".join(json.dumps({**LINE, "custom_id": str(i)}) for i in range(num_lines)) + "\n"
    return gateway.client.post(
        "/v1/files",
        files={"file": ("requests.jsonl", content.encode())},
        data={"purpose": "batch"},
        headers={"Authorization": f"Bearer {key}"},
    )


def _keys() -> str:
    return f"alice:{hash_key(ALICE)},bob:{hash_key(BOB)}"


def test_a_key_stores_at_most_its_quota_of_files(make_gateway: Callable[..., RunningGateway]) -> None:
    gateway = make_gateway(api_key_hashes=_keys(), max_files_per_key=2, max_file_bytes_per_key=4000)
    first, second = (_upload(gateway, ALICE) for _ in range(2))
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    third = _upload(gateway, ALICE)
    assert third.status_code == 429, third.text
    error = third.json()["error"]
    assert error["code"] == "file_quota_exceeded" and "GATEWAY_MAX_FILES_PER_KEY 2" in error["message"]
    assert _upload(gateway, BOB).status_code == 200  # another key's quota is its own
    # Deleting a file gives its room back.
    alice = {"Authorization": f"Bearer {ALICE}"}
    assert gateway.client.delete(f"/v1/files/{first.json()['id']}", headers=alice).status_code == 200
    assert _upload(gateway, ALICE).status_code == 200

    # Bytes: Bob holds one small file; a large one would pass his 4000 bytes together.
    large = _upload(gateway, BOB, num_lines=40)
    assert large.status_code == 413, large.text
    error = large.json()["error"]
    assert error["code"] == "file_quota_exceeded", error
    assert "GATEWAY_MAX_FILE_BYTES_PER_KEY 4000" in error["message"], error


def test_a_key_keeps_at_most_its_quota_of_batches_in_flight(
    make_gateway: Callable[..., RunningGateway],
) -> None:
    # No Celery worker runs: a created batch stays `validating`, in flight.
    gateway = make_gateway(api_key_hashes=_keys(), max_batches_per_key=1)
    alice = {"Authorization": f"Bearer {ALICE}"}

    def create(key: str) -> httpx.Response:
        file_id = _upload(gateway, key).json()["id"]
        body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
        return gateway.client.post("/v1/batches", json=body, headers={"Authorization": f"Bearer {key}"})

    first = create(ALICE)
    assert first.status_code == 200 and first.json()["status"] == "validating", first.text
    second = create(ALICE)
    assert second.status_code == 429, second.text
    error = second.json()["error"]
    assert error["code"] == "batch_quota_exceeded" and "GATEWAY_MAX_BATCHES_PER_KEY 1" in error["message"]
    assert create(BOB).status_code == 200
    # A cancelled batch is no longer in flight.
    cancelled = gateway.client.post(f"/v1/batches/{first.json()['id']}/cancel", headers=alice)
    assert cancelled.json()["status"] == "cancelled", cancelled.text
    assert create(ALICE).status_code == 200
