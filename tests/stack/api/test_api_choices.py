"""n > 1 through the gateway, with the harness playing the worker: fan-out, merging, failures, aborts."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from tokenizers import Tokenizer

from harness.gateway.gateway_server import RunningGateway
from harness.gateway.sse_client import post_sse
from harness.processes.services import wait_for


def _ids(tiny_model_dir: Path, text: str) -> list[int]:
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    return list(tok.encode(text, add_special_tokens=False).ids)


def test_fan_out_derives_seeds_and_merges_streams(gateway: RunningGateway, tiny_model_dir: Path) -> None:
    body = {"prompt": "hi", "max_tokens": 4, "n": 2, "seed": 40, "user": "u-1", "stream": True}
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(post_sse, gateway.client, "/v1/completions", body)
        first, second = gateway.harness.next_request(), gateway.harness.next_request()
        assert first.req_id != second.req_id
        assert first.prompt_token_ids == second.prompt_token_ids
        assert [first.sampling_params.seed, second.sampling_params.seed] == [40, 41]
        assert first.user == second.user == "u-1"
        # Choice 1 finishes before choice 0 has ended: chunks interleave, tagged by index.
        head = _ids(tiny_model_dir, " Return")
        gateway.harness.emit_tokens(first.req_id, head, finish_reason=None)
        gateway.harness.emit_tokens(second.req_id, _ids(tiny_model_dir, " the value"), finish_reason="length")
        gateway.harness.emit_tokens(
            first.req_id, _ids(tiny_model_dir, " now"), start_index=len(head), finish_reason="length"
        )
        response, events = future.result(timeout=30)
    assert response.status_code == 200
    chunks = [e.json() for e in events if e.data != "[DONE]"]
    texts = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == {0: " Return now", 1: " the value"}
    # Two token streams interleave: no entry id could name a resume point.
    assert all(e.id is None for e in events)


def test_one_failed_choice_fails_the_request_and_aborts_the_rest(gateway: RunningGateway) -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(
            gateway.client.post, "/v1/completions", json={"prompt": "hi", "max_tokens": 5, "n": 2}
        )
        first, second = gateway.harness.next_request(), gateway.harness.next_request()
        gateway.harness.emit_error(second.req_id, "the worker fell over")
        response = future.result(timeout=30)
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "the worker fell over"
    assert gateway.harness.wait_abort(first.req_id, timeout_s=15).reason == "abort"


def test_stream_disconnect_aborts_every_choice(gateway: RunningGateway, tiny_model_dir: Path) -> None:
    def read_first_event_then_hang_up() -> str:
        body = {"prompt": "hi", "max_tokens": 50, "n": 3, "stream": True}
        with (
            httpx.Client(base_url=gateway.url, timeout=30) as client,
            client.stream("POST", "/v1/completions", json=body) as r,
        ):
            for text in r.iter_text():
                if text:
                    return text
        raise AssertionError("stream ended without an event")

    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(read_first_event_then_hang_up)
        requests = [gateway.harness.next_request() for _ in range(3)]
        gateway.harness.emit_tokens(requests[1].req_id, _ids(tiny_model_dir, " Return"), finish_reason=None)
        assert future.result(timeout=30).startswith("data: ")
    # Aborts arrive in any order: wait on the whole set (wait_abort skips the others it reads).
    wanted = {r.req_id for r in requests}
    wait_for(lambda: wanted <= {a.req_id for a in gateway.harness.aborts()}, 15, "every choice aborted")
    assert {a.reason for a in gateway.harness.aborts() if a.req_id in wanted} == {"abort"}
