"""OpenAI's stored chat completions over real HTTP: `store: true` keeps the answer as its client got
it (streamed or not) with its messages and metadata; it is read, listed by metadata, updated and
deleted per API key. The test harness plays the worker."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from tokenizers import Tokenizer

from gateway.security.api_keys import hash_key
from harness.gateway.gateway_server import RunningGateway
from harness.gateway.sse_client import post_sse

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is assert?"}]
ALICE, BOB = "alice-key", "bob-key"


def _answer(
    gw: RunningGateway, body: dict[str, Any], text_ids: list[int], headers: dict[str, str] | None = None
) -> Any:
    """POST a chat completion and play the worker; the JSON body, or the SSE events when streamed."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        if body.get("stream"):
            client = httpx.Client(base_url=gw.url, timeout=30, headers=headers)
            future: Any = pool.submit(post_sse, client, "/v1/chat/completions", body)
        else:
            future = pool.submit(gw.client.post, "/v1/chat/completions", json=body, headers=headers)
        request = gw.harness.next_request()
        gw.harness.emit_tokens(request.req_id, text_ids, finish_reason="length")
        result = future.result(timeout=30)
    return result[1] if body.get("stream") else result.json()


def test_a_stored_completion_is_read_updated_listed_and_deleted(
    gateway: RunningGateway, tiny_model_dir: Any
) -> None:
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    ids = tok.encode(" It checks", add_special_tokens=False).ids
    body = {"messages": MESSAGES, "max_tokens": 8, "store": True, "metadata": {"run": "a"}}
    answer = _answer(gateway, body, ids)
    client = gateway.client
    stored = client.get(f"/v1/chat/completions/{answer['id']}").json()
    assert stored == {**answer, "metadata": {"run": "a"}}
    messages = client.get(f"/v1/chat/completions/{answer['id']}/messages").json()
    assert [m["content"] for m in messages["data"]] == [m["content"] for m in MESSAGES]
    assert messages["data"][0]["id"] == f"{answer['id']}-0" and not messages["has_more"]
    newest = client.get(
        f"/v1/chat/completions/{answer['id']}/messages", params={"order": "desc", "limit": 1}
    ).json()
    assert newest["data"][0]["role"] == "user" and newest["has_more"]

    other = _answer(gateway, {**body, "metadata": {"run": "b"}}, ids)
    _answer(gateway, {"messages": MESSAGES, "max_tokens": 8}, ids)  # not stored
    listed = client.get("/v1/chat/completions").json()
    assert [c["id"] for c in listed["data"]] == [answer["id"], other["id"]]
    only_b = client.get("/v1/chat/completions", params={"metadata[run]": "b"}).json()
    assert [c["id"] for c in only_b["data"]] == [other["id"]]

    updated = client.post(f"/v1/chat/completions/{answer['id']}", json={"metadata": {"run": "b"}})
    assert updated.status_code == 200 and updated.json()["metadata"] == {"run": "b"}
    assert len(client.get("/v1/chat/completions", params={"metadata[run]": "b"}).json()["data"]) == 2

    deleted = client.delete(f"/v1/chat/completions/{answer['id']}").json()
    assert deleted == {"object": "chat.completion.deleted", "id": answer["id"], "deleted": True}
    assert client.get(f"/v1/chat/completions/{answer['id']}").status_code == 404
    assert [c["id"] for c in client.get("/v1/chat/completions").json()["data"]] == [other["id"]]


def test_a_streamed_completion_is_stored_as_streamed(gateway: RunningGateway, tiny_model_dir: Any) -> None:
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    ids = tok.encode(" It checks a condition", add_special_tokens=False).ids
    events = _answer(gateway, {"messages": MESSAGES, "max_tokens": 16, "stream": True, "store": True}, ids)
    chunks = [e.json() for e in events if e.data != "[DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    # Stored before [DONE]: readable as soon as the stream is read.
    stored = gateway.client.get(f"/v1/chat/completions/{chunks[0]['id']}").json()
    assert stored["choices"][0]["message"]["content"] == text == " It checks a condition"
    assert stored["usage"]["completion_tokens"] == len(ids)


def test_stored_completions_are_per_api_key(
    make_gateway: Callable[..., RunningGateway], tiny_model_dir: Any
) -> None:
    gw = make_gateway(api_key_hashes=f"alice:{hash_key(ALICE)},bob:{hash_key(BOB)}")
    alice, bob = {"Authorization": f"Bearer {ALICE}"}, {"Authorization": f"Bearer {BOB}"}
    answer = _answer(gw, {"messages": MESSAGES, "max_tokens": 4, "store": True}, [300], alice)
    assert gw.client.get(f"/v1/chat/completions/{answer['id']}", headers=alice).status_code == 200
    assert gw.client.get(f"/v1/chat/completions/{answer['id']}", headers=bob).status_code == 404
    assert gw.client.delete(f"/v1/chat/completions/{answer['id']}", headers=bob).status_code == 404
    assert gw.client.get("/v1/chat/completions", headers=bob).json()["data"] == []
    refused = gw.client.post("/v1/completions", json={"prompt": "hi", "store": True}, headers=alice)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "store"


def test_every_new_option_at_once_is_answered_and_stored(
    gateway: RunningGateway, tiny_model_dir: Any
) -> None:
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    ids = tok.encode(" It checks<|im_end|>", add_special_tokens=False).ids
    body = {
        "messages": MESSAGES,
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "chat_template_kwargs": {"enable_thinking": False},
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "stop": ["checks"],
        "metadata": {"client": "held-out"},
        "store": True,
    }
    events = _answer(gateway, body, ids)
    chunks = [e.json() for e in events if e.data != "[DONE]"]
    assert all(c["usage"] is not None for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == " It checks"  # cut after the stop string, which stays
    stored = gateway.client.get(f"/v1/chat/completions/{chunks[0]['id']}").json()
    assert stored["choices"][0]["message"]["content"] == text and stored["metadata"] == {"client": "held-out"}
