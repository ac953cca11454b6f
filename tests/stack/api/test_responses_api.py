"""The Responses API through the official `openai` SDK, against the real stack (uvicorn gateway,
Redis, batcher, worker, tiny model), with two API keys.

A response runs as the chat request of the same messages, so its greedy text must equal the chat
endpoint's; stored responses continue conversations, are owned by their key, and background ones
can be cancelled or have their event stream resumed after a disconnect.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from common.protocol import FIELD, RequestError, decode_event, decode_request
from common.settings import RETENTION_S
from common.streams import REQUESTS_STREAM, response_key, token_stream
from gateway.security.api_keys import hash_key
from harness.processes.services import Stack, running_stack, wait_for
from openai_frontend.responses.input import _UNSUPPORTED

KEY_A, KEY_B = "sk-responses-alice", "sk-responses-bob"
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
CLOSING_EVENTS = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.incomplete",  # ignore_eos: max_output_tokens ends every greedy response here
]


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    keys = f"alice:{hash_key(KEY_A)},bob:{hash_key(KEY_B)}"
    with running_stack(
        tmp_path_factory.mktemp("responses-stack"), tiny_model_dir, GATEWAY_API_KEY_HASHES=keys
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    with stack.sdk(KEY_A) as c:
        yield c


@pytest.fixture(scope="module")
def model_name(tiny_model_dir: Path) -> str:
    return tiny_model_dir.name


def chat_text(client: openai.OpenAI, model: str, messages: list[dict[str, str]], max_tokens: int) -> str:
    answer = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, **GREEDY)  # type: ignore[arg-type]
    return answer.choices[0].message.content or ""


def test_plain_response_is_the_chat_answer(client: openai.OpenAI, model_name: str) -> None:
    response = client.responses.create(
        model=model_name, instructions="Be brief.", input="Say hello.", max_output_tokens=12, **GREEDY
    )
    assert response.object == "response"
    assert response.id.startswith("resp_")
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    message = response.output[0]
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
    assert response.output_text == chat_text(client, model_name, messages, 12)
    assert response.usage is not None
    assert response.usage.output_tokens == 12
    assert response.usage.total_tokens == response.usage.input_tokens + 12
    assert response.usage.input_tokens_details.cached_tokens >= 0
    assert response.instructions == "Be brief."
    assert response.max_output_tokens == 12


def test_input_items_render_as_chat_messages(client: openai.OpenAI, model_name: str) -> None:
    items: Any = [
        {"role": "developer", "content": "You answer in one word."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a color."}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Red.", "annotations": []}]},
        {"role": "user", "content": "Another one."},
    ]
    response = client.responses.create(model=model_name, input=items, max_output_tokens=10, **GREEDY)
    messages = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Red."},
        {"role": "user", "content": "Another one."},
    ]
    assert response.output_text == chat_text(client, model_name, messages, 10)


def test_stream_events_in_openai_order(client: openai.OpenAI, model_name: str) -> None:
    with client.responses.create(
        model=model_name, input="Count to three.", max_output_tokens=16, stream=True, **GREEDY
    ) as stream:
        events = list(stream)
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert types == TEXT_EVENTS + ["response.output_text.delta"] * len(deltas) + CLOSING_EVENTS
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress"  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    text = "".join(d.delta for d in deltas)  # type: ignore[union-attr]
    assert final.output_text == text
    assert text == chat_text(client, model_name, [{"role": "user", "content": "Count to three."}], 16)
    assert client.responses.retrieve(final.id).output_text == text


def test_retrieve_delete_and_store_false(stack: Stack, client: openai.OpenAI, model_name: str) -> None:
    response = client.responses.create(
        model=model_name, input="Hi.", max_output_tokens=4, metadata={"topic": "greeting"}, **GREEDY
    )
    fetched = client.responses.retrieve(response.id)
    assert fetched.output_text == response.output_text
    assert fetched.metadata == {"topic": "greeting"}
    # Kept for the retention window once it ended, like the request's other keys.
    ttl = redis.Redis.from_url(stack.redis_url).ttl(response_key(response.id.removeprefix("resp_")))
    assert 0 < ttl <= RETENTION_S  # type: ignore[operator]
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.retrieve(response.id, include=["message.output_text.logprobs"])
    assert exc.value.code == "unsupported_parameter"  # type: ignore[attr-defined]
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    unstored = client.responses.create(
        model=model_name, input="Hi.", max_output_tokens=4, store=False, **GREEDY
    )
    assert unstored.output_text == response.output_text
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI, model_name: str) -> None:
    first = client.responses.create(
        model=model_name, instructions="Be kind.", input="Pick a number.", max_output_tokens=6, **GREEDY
    )
    second = client.responses.create(
        model=model_name, previous_response_id=first.id, input="Double it.", max_output_tokens=6, **GREEDY
    )
    assert second.previous_response_id == first.id
    # Instructions are not carried over to the next turn.
    messages = [
        {"role": "user", "content": "Pick a number."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Double it."},
    ]
    assert second.output_text == chat_text(client, model_name, messages, 6)


def test_another_key_sees_nothing(stack: Stack, client: openai.OpenAI, model_name: str) -> None:
    response = client.responses.create(model=model_name, input="Secret.", max_output_tokens=3, **GREEDY)
    with stack.sdk(KEY_B) as bob:
        with pytest.raises(openai.NotFoundError):
            bob.responses.retrieve(response.id)
        with pytest.raises(openai.NotFoundError):
            bob.responses.delete(response.id)
        with pytest.raises(openai.NotFoundError):
            bob.responses.cancel(response.id)
        with pytest.raises(openai.NotFoundError) as exc:
            bob.responses.create(model=model_name, previous_response_id=response.id, input="And?")
        assert exc.value.param == "previous_response_id"  # type: ignore[attr-defined]
    assert client.responses.retrieve(response.id).output_text == response.output_text


# Every field the request declares but does not implement, with a value that asks for it.
REFUSED: dict[str, Any] = {
    "max_tool_calls": 3,
    "reasoning": {"effort": "low"},
    "include": ["message.output_text.logprobs"],
    "truncation": "auto",
    "top_logprobs": 2,
    "stream_options": {"include_obfuscation": True},
    "background_options": {"completion_window": "2h"},
    "conversation": "conv_1",
    "context_management": [{"type": "compaction"}],
    "prompt": {"id": "pmpt_1"},
    "prompt_cache_key": "k",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "explicit"},
    "safety_identifier": "s-1",
    "service_tier": "flex",
    "moderation": {"model": "omni-moderation-latest"},
    "image": {"context_compression": "enabled"},
    "access_programs": {"cyber": "standard"},
}
REFUSED_SHAPES: list[tuple[dict[str, Any], str]] = [
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
]


def test_every_unimplemented_field_has_a_refusal_row() -> None:
    assert set(REFUSED) == set(_UNSUPPORTED)


@pytest.mark.parametrize(
    ("extra", "param"), [({field: value}, field) for field, value in REFUSED.items()] + REFUSED_SHAPES
)
def test_unsupported_parameters_are_refused_by_name(stack: Stack, extra: dict[str, Any], param: str) -> None:
    body = {"input": "hi", **extra}
    answer = httpx.post(
        f"{stack.base_url}/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=30
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == (param, "unsupported_parameter")


def test_a_text_model_refuses_input_image_by_name(stack: Stack) -> None:
    """input_image parts are read (tests/stack/api/test_image_inputs.py); the tiny model reads text only."""
    body = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}
    answer = httpx.post(
        f"{stack.base_url}/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=30
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == ("input", "image_input_not_supported")
    assert "reads text only" in error["message"]


def test_refusals_name_the_responses_parameters(client: openai.OpenAI, model_name: str) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model=model_name, input="hi", max_output_tokens=0)
    assert exc.value.param == "max_output_tokens"  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model=model_name, input="hi", background=True, store=False)
    assert exc.value.param == "background"  # type: ignore[attr-defined]


def _events(stack: Stack, req_id: str) -> list[Any]:
    entries: Any = redis.Redis.from_url(stack.redis_url).xrange(token_stream(req_id))
    return [decode_event(fields[FIELD]) for _, fields in entries]


def test_background_response_is_polled_then_cancelled(
    stack: Stack, client: openai.OpenAI, model_name: str
) -> None:
    done = client.responses.create(
        model=model_name, input="Hi.", max_output_tokens=5, background=True, **GREEDY
    )
    assert done.status == "queued" and done.background

    def finished() -> bool:
        return client.responses.retrieve(done.id).status == "incomplete"

    wait_for(finished, 60, "the background response to finish", interval=0.1)
    assert client.responses.retrieve(done.id).output_text == chat_text(
        client, model_name, [{"role": "user", "content": "Hi."}], 5
    )

    long = client.responses.create(
        model=model_name, input="Tell a long story.", max_output_tokens=480, background=True, **GREEDY
    )
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert client.responses.cancel(long.id).status == "cancelled"  # idempotent
    assert client.responses.retrieve(long.id).status == "cancelled"
    req_id = long.id.removeprefix("resp_")

    def aborted() -> bool:
        return any(
            isinstance(e, RequestError) and e.code == "request_aborted" for e in _events(stack, req_id)
        )

    wait_for(aborted, 30, "the batcher to abort the cancelled response")


def leave_and_resume(client: openai.OpenAI, body: dict[str, Any], delta: str) -> tuple[list[Any], list[Any]]:
    """A background stream of `body` read until its 5th `delta` event, left, then resumed after the
    last event read: (the events read, the events resumed)."""
    seen: list[Any] = []
    stream = client.responses.create(**body, background=True, stream=True)
    for event in stream:
        seen.append(event)
        if sum(e.type == delta for e in seen) == 5:
            break
    stream.close()  # the client goes away; a background response runs on
    last = seen[-1].sequence_number
    with client.responses.retrieve(seen[0].response.id, stream=True, starting_after=last) as resumed:
        rest = list(resumed)
    assert rest[0].sequence_number == last + 1
    return seen, rest


def test_background_stream_resumes_after_a_disconnect(client: openai.OpenAI, model_name: str) -> None:
    body = {"model": model_name, "input": "Write a poem.", "max_output_tokens": 300, **GREEDY}
    seen, rest = leave_and_resume(client, body, "response.output_text.delta")
    response_id = seen[0].response.id
    events = seen + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.incomplete"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == client.responses.retrieve(response_id).output_text
    assert text == chat_text(client, model_name, [{"role": "user", "content": "Write a poem."}], 300)


def test_stream_helper_reads_a_cut_response_as_from_openai(client: openai.OpenAI, model_name: str) -> None:
    """Cut by max_output_tokens, the stream ends as OpenAI's does (`response.incomplete` carrying the
    whole Response), which the SDK's helper iterates without error; its get_final_response() keeps
    only a `response.completed`, so the last event is where a client finds the final Response."""
    body = {"model": model_name, "input": "Say hello.", "max_output_tokens": 6, **GREEDY}
    with client.responses.stream(**body) as stream:
        events = list(stream)
    final = events[-1]
    assert final.type == "response.incomplete"
    response = final.response
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 6
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert response.output_text == text == client.responses.create(**body).output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_leaving_a_foreground_stream_cancels_it(client: openai.OpenAI, model_name: str) -> None:
    seen: list[Any] = []
    stream = client.responses.create(
        model=model_name, input="Go on and on.", max_output_tokens=480, stream=True, **GREEDY
    )
    for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    stream.close()
    response_id = seen[0].response.id

    def cancelled() -> bool:
        return client.responses.retrieve(response_id).status == "cancelled"

    wait_for(cancelled, 30, "the abandoned foreground response to be cancelled", interval=0.1)


def test_background_response_stops_at_its_stop_string(
    stack: Stack, client: openai.OpenAI, model_name: str
) -> None:
    messages = [{"role": "user", "content": "Say something."}]
    text = chat_text(client, model_name, messages, 40)
    stop = text[8:12]
    response = client.responses.create(
        model=model_name,
        input="Say something.",
        max_output_tokens=480,
        background=True,
        temperature=0,
        extra_body={"ignore_eos": True, "stop": [stop]},
    )

    def finished() -> bool:
        return client.responses.retrieve(response.id).status == "completed"

    wait_for(finished, 60, "the background response to stop at its stop string", interval=0.1)
    assert client.responses.retrieve(response.id).output_text == text[: text.index(stop)]
    # Its gateway followed it and stopped it there, long before max_output_tokens.
    num_tokens = redis.Redis.from_url(stack.redis_url).xlen(token_stream(response.id.removeprefix("resp_")))
    assert num_tokens < 480


def test_sampling_parameters_reach_the_batcher(stack: Stack, client: openai.OpenAI, model_name: str) -> None:
    response = client.responses.create(
        model=model_name,
        input="Hi.",
        max_output_tokens=3,
        temperature=0.5,
        top_p=0.9,
        user="user-7",
        extra_body={
            "seed": 7,
            "top_k": 5,
            "min_p": 0.1,
            "presence_penalty": 0.5,
            "frequency_penalty": 0.25,
            "repetition_penalty": 1.1,
            "logit_bias": {"5": 1.0},
            "min_tokens": 1,
            "stop_token_ids": [5],
        },
    )
    req_id = response.id.removeprefix("resp_")
    entries: Any = redis.Redis.from_url(stack.redis_url).xrange(REQUESTS_STREAM)
    sent = next(r for r in (decode_request(f[FIELD]) for _, f in entries) if r.req_id == req_id)
    params = sent.sampling_params
    assert (params.max_tokens, params.temperature, params.top_p, params.seed) == (3, 0.5, 0.9, 7)
    assert (params.top_k, params.min_p, params.min_tokens, params.stop_token_ids) == (5, 0.1, 1, [5])
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, 0.25, 1.1)
    assert params.logit_bias == {5: 1.0}
    assert sent.user == "user-7" and sent.owner == "alice"
    assert (response.temperature, response.top_p, response.user) == (0.5, 0.9, "user-7")
