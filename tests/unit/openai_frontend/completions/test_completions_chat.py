"""The chat renderer (completions/chat.py) against the OpenAI SDK's own types: every body must validate as
`ChatCompletion` and every chunk as `ChatCompletionChunk`, with OpenAI's layout of choices, usage,
logprobs and tool calls, and `finish_reason` "tool_calls" for a turn that ended after calling tools."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from openai_frontend.completions.chat import CHAT
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.generate.request_builder import prepare_choices
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest
from tests.unit.openai_frontend.completions.completions_inputs import body, logprob, outputs, stream

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def requests(served: ServedModel, **fields: Any) -> list[PreparedRequest]:
    chat = ChatCompletionRequest.model_validate({"messages": USER, **fields})
    return prepare_choices(chat, served, 1_700_000_000.0, req_id="r")


def test_a_body_with_two_choices(tiny_served: ServedModel) -> None:
    choices = requests(tiny_served, n=2, seed=1)
    outs = [
        outputs(tiny_served, "r", "Sunny.", "stop", eos=True, cached=3),
        outputs(tiny_served, "r-1", "It is", "length", cached=5),
    ]
    answer = body(CHAT, tiny_served, choices, outs)
    ChatCompletion.model_validate(answer)
    assert (answer["object"], answer["id"], answer["model"], answer["created"]) == (
        "chat.completion",
        "chatcmpl-r",
        "tiny",
        1_700_000_000,
    )
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert [c["message"] for c in answer["choices"]] == [
        {"role": "assistant", "content": "Sunny."},
        {"role": "assistant", "content": "It is"},
    ]
    assert [c["finish_reason"] for c in answer["choices"]] == ["stop", "length"]
    assert [c["logprobs"] for c in answer["choices"]] == [None, None]
    assert all("token_ids" not in c for c in answer["choices"])  # only when asked
    # One prompt, counted once for both choices; the EOS token is output too; cached: the fewest.
    prompt = choices[0].num_prompt_tokens
    completion = len(outs[0]) + len(outs[1])
    assert answer["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 3},
    }


def test_a_stream_opens_each_choice_with_its_role_then_sends_deltas(tiny_served: ServedModel) -> None:
    choices = requests(tiny_served, n=2, stream=True)
    outs = [outputs(tiny_served, "r", "Hi there", "stop"), outputs(tiny_served, "r-1", "Hello", "length")]
    chunks = stream(CHAT, tiny_served, choices, outs)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
        assert (chunk["object"], chunk["id"], chunk["created"]) == (
            "chat.completion.chunk",
            "chatcmpl-r",
            1_700_000_000,
        )
        assert "usage" not in chunk and len(chunk["choices"]) == 1  # usage was not asked for
    opening = [chunk["choices"][0] for chunk in chunks[:2]]
    assert [(c["index"], c["delta"], c["finish_reason"]) for c in opening] == [
        (0, {"role": "assistant", "content": ""}, None),
        (1, {"role": "assistant", "content": ""}, None),
    ]
    for index, text, finish_reason in ((0, "Hi there", "stop"), (1, "Hello", "length")):
        mine = [c["choices"][0] for c in chunks[2:] if c["choices"][0]["index"] == index]
        assert "".join(c["delta"]["content"] for c in mine) == text
        assert [c["finish_reason"] for c in mine] == [None] * (len(mine) - 1) + [finish_reason]


def test_a_stream_that_asked_for_usage_ends_with_it(tiny_served: ServedModel) -> None:
    choices = requests(tiny_served, stream=True, stream_options={"include_usage": True})
    outs = [outputs(tiny_served, "r", "Sunny.", "stop", eos=True, cached=2)]
    *deltas, last = stream(CHAT, tiny_served, choices, outs)
    # As OpenAI: `usage: null` on every chunk, then one chunk with no choices and the usage.
    assert all(chunk["usage"] is None for chunk in deltas)
    ChatCompletionChunk.model_validate(last)
    prompt = choices[0].num_prompt_tokens
    assert last["choices"] == [] and last["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": len(outs[0]),
        "total_tokens": prompt + len(outs[0]),
        "prompt_tokens_details": {"cached_tokens": 2},
    }


def test_continuous_usage_counts_the_tokens_so_far_on_every_chunk(tiny_served: ServedModel) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    choices = requests(tiny_served, stream=True, stream_options=options)
    outs = [outputs(tiny_served, "r", "Sunny today", "stop")]
    opening, *deltas, _ = stream(CHAT, tiny_served, choices, outs)
    assert opening["usage"]["completion_tokens"] == 0
    assert [chunk["usage"]["completion_tokens"] for chunk in deltas] == list(range(1, len(outs[0]) + 1))
    assert {chunk["usage"]["prompt_tokens"] for chunk in deltas} == {choices[0].num_prompt_tokens}


def test_logprobs_are_openais_content_list(tiny_served: ServedModel) -> None:
    choices = requests(tiny_served, logprobs=True, top_logprobs=2)
    outs = [outputs(tiny_served, "r", "Sunny.", "stop", eos=True)]
    answer = body(CHAT, tiny_served, choices, outs)
    ChatCompletion.model_validate(answer)
    content = answer["choices"][0]["logprobs"]["content"]
    token_ids = [out.token_ids[0] for out in outs[0]]
    assert len(content) == len(token_ids)  # the EOS token has an entry too
    decode = tiny_served.tokenizer.tokenizer.decode
    for i, (entry, token_id) in enumerate(zip(content, token_ids, strict=True)):
        text = decode([token_id], skip_special_tokens=False)
        assert entry["token"] == text and entry["bytes"] == list(text.encode())
        assert entry["logprob"] == logprob(i)
        assert [top["logprob"] for top in entry["top_logprobs"]] == [logprob(i), logprob(i) - 1]
        assert entry["top_logprobs"][0]["token"] == text
    assert content[-1]["token"] == "<|endoftext|>"
    streamed = stream(
        CHAT, tiny_served, requests(tiny_served, logprobs=True, top_logprobs=2, stream=True), outs
    )
    for chunk in streamed:
        ChatCompletionChunk.model_validate(chunk)
    assert [e for chunk in streamed[1:] for e in chunk["choices"][0]["logprobs"]["content"]] == content


def test_token_ids_when_asked(tiny_served: ServedModel) -> None:
    outs = [outputs(tiny_served, "r", "Sunny.", "stop")]
    ids = [out.token_ids[0] for out in outs[0]]
    answer = body(CHAT, tiny_served, requests(tiny_served, return_token_ids=True), outs)
    assert answer["choices"][0]["token_ids"] == ids
    chunks = stream(CHAT, tiny_served, requests(tiny_served, return_token_ids=True, stream=True), outs)
    assert [t for chunk in chunks[1:] for t in chunk["choices"][0]["token_ids"]] == ids


def with_parsers(choices: list[PreparedRequest], **parsers: str) -> list[PreparedRequest]:
    return [msgspec.structs.replace(choice, **parsers) for choice in choices]


@pytest.mark.parametrize(("finish_reason", "shown"), [("stop", "tool_calls"), ("length", "length")])
def test_a_turn_that_called_tools_ends_with_tool_calls(
    tiny_served: ServedModel, finish_reason: str, shown: str
) -> None:
    outs = [outputs(tiny_served, "r", "Let me check.\n" + CALL, finish_reason)]
    answer = body(CHAT, tiny_served, with_parsers(requests(tiny_served), tool_parser="hermes"), outs)
    ChatCompletion.model_validate(answer)
    [choice] = answer["choices"]
    assert choice["finish_reason"] == shown
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert choice["message"]["content"] == "Let me check."

    streamed = with_parsers(requests(tiny_served, stream=True), tool_parser="hermes")
    chunks = stream(CHAT, tiny_served, streamed, outs)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    pieces = [d for chunk in chunks for d in chunk["choices"][0]["delta"].get("tool_calls", [])]
    # The first piece names the call; the others carry only arguments, which add up to the body's.
    assert {k: pieces[0][k] for k in ("index", "id", "type")} == {
        "index": 0,
        "id": call["id"],
        "type": "function",
    }
    assert pieces[0]["function"]["name"] == "get_weather"
    assert all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"} for p in pieces[1:])
    assert "".join(p["function"]["arguments"] for p in pieces) == call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == shown


def test_a_call_alone_has_null_content_and_plain_text_stays_stop(tiny_served: ServedModel) -> None:
    parsed = with_parsers(requests(tiny_served), tool_parser="hermes")
    answer = body(CHAT, tiny_served, parsed, [outputs(tiny_served, "r", CALL, "stop")])
    ChatCompletion.model_validate(answer)
    assert answer["choices"][0]["message"]["content"] is None
    answer = body(CHAT, tiny_served, parsed, [outputs(tiny_served, "r", "No tools needed.", "stop")])
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "No tools needed."}


def test_thoughts_are_reasoning_content_and_counted_in_usage(tiny_served: ServedModel) -> None:
    text = "<think>Paris is in France.</think>Sunny."
    outs = [outputs(tiny_served, "r", text, "stop")]
    answer = body(CHAT, tiny_served, with_parsers(requests(tiny_served), reasoning_parser="think"), outs)
    ChatCompletion.model_validate(answer)
    message = answer["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Paris is in France.", "Sunny.")
    reasoning = answer["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert 0 < reasoning < answer["usage"]["completion_tokens"]  # the answer's tokens are not thoughts

    options = {"include_usage": True}
    streamed = with_parsers(
        requests(tiny_served, stream=True, stream_options=options), reasoning_parser="think"
    )
    chunks = stream(CHAT, tiny_served, streamed, outs)
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks[1:-1]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Paris is in France."
    assert "".join(d.get("content", "") for d in deltas) == "Sunny."
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": reasoning}
    assert json.dumps(chunks[-1]["usage"]) == json.dumps(answer["usage"])
