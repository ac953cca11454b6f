"""A body becomes its choices' records (generate/request_builder.py's `prepare_choices`), called
directly: n per prompt, numbered as OpenAI and vLLM number them, each with its own id and, with a
seed, seed + i; best_of only where it ranks nothing; every prompt checked before any choice exists."""

from __future__ import annotations

from typing import Any

import pytest

from openai_frontend.generate.options import BATCH_PRIORITY, INTERACTIVE_PRIORITY
from openai_frontend.generate.prompts import MAX_PROMPTS
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.generate.request_builder import prepare_choices
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.errors import OpenAIError
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest, CompletionRequest

USER = [{"role": "user", "content": "Say something."}]
ARRIVAL = 1_700_000_000.5


def chat_choices(served: ServedModel, **fields: Any) -> list[PreparedRequest]:
    body = ChatCompletionRequest.model_validate({"messages": USER, **fields})
    return prepare_choices(body, served, ARRIVAL, req_id="r")


def completion_choices(served: ServedModel, **fields: Any) -> list[PreparedRequest]:
    body = CompletionRequest.model_validate({"prompt": "Once upon a time", **fields})
    return prepare_choices(body, served, ARRIVAL, req_id="r")


def test_one_choice_by_default(tiny_served: ServedModel) -> None:
    [choice] = chat_choices(tiny_served)
    assert (choice.req_id, choice.response_id, choice.kind, choice.model, choice.n) == (
        "r",
        "chatcmpl-r",
        "chat",
        "tiny",
        1,
    )
    assert choice.num_prompt_tokens == len(choice.message.prompt_token_ids) > 0
    assert choice.message.arrival_time == ARRIVAL and choice.created == int(ARRIVAL)
    assert choice.message.priority == INTERACTIVE_PRIORITY
    # No max_tokens: all the room the context leaves.
    assert choice.message.sampling_params.max_tokens == 512 - choice.num_prompt_tokens


def test_n_choices_share_the_prompt_and_differ_in_id_and_seed(tiny_served: ServedModel) -> None:
    choices = chat_choices(tiny_served, n=3, seed=7, temperature=0.8)
    assert [c.req_id for c in choices] == ["r", "r-1", "r-2"]
    assert [c.message.sampling_params.seed for c in choices] == [7, 8, 9]
    assert {c.n for c in choices} == {3}
    first = choices[0]
    for choice in choices[1:]:
        assert choice.message.prompt_token_ids == first.message.prompt_token_ids
        assert choice.response_id == f"chatcmpl-{choice.req_id}"
        # Only the id and the seed differ between a prompt's choices.
        assert choice.message.sampling_params.temperature == 0.8
        assert choice.num_prompt_tokens == first.num_prompt_tokens


def test_n_choices_without_a_seed_stay_unseeded(tiny_served: ServedModel) -> None:
    choices = completion_choices(tiny_served, n=2, temperature=1.0)
    assert [c.req_id for c in choices] == ["r", "r-1"]
    assert [c.message.sampling_params.seed for c in choices] == [None, None]


def test_a_list_of_prompts_numbers_choices_prompt_by_prompt(tiny_served: ServedModel) -> None:
    prompts = ["Once upon a time", "The end"]
    choices = completion_choices(tiny_served, prompt=prompts, n=2, seed=5, echo=True, max_tokens=4)
    assert [c.req_id for c in choices] == ["r", "r-1", "r-2", "r-3"]
    # Choice prompt_index * n + i: each prompt's choices use seed + i, as one prompt's would.
    assert [c.message.sampling_params.seed for c in choices] == [5, 6, 5, 6]
    assert [c.echo_text for c in choices] == ["Once upon a time"] * 2 + ["The end"] * 2
    ids = [tiny_served.tokenizer.encode(p, add_special_tokens=True) for p in prompts]
    assert [c.message.prompt_token_ids for c in choices] == [ids[0], ids[0], ids[1], ids[1]]
    assert [c.num_prompt_tokens for c in choices] == [len(ids[0])] * 2 + [len(ids[1])] * 2


def test_each_prompt_gets_the_room_its_own_length_leaves(tiny_served: ServedModel) -> None:
    short, long = [1, 2], list(range(3, 103))
    choices = completion_choices(tiny_served, prompt=[short, long])
    assert [c.message.sampling_params.max_tokens for c in choices] == [510, 412]


def test_token_id_prompts_echo_their_decoded_text(tiny_served: ServedModel) -> None:
    ids = tiny_served.tokenizer.encode("hello world", add_special_tokens=False)
    [choice] = completion_choices(tiny_served, prompt=ids, echo=True, max_tokens=1)
    assert choice.message.prompt_token_ids == ids
    assert choice.echo_text == tiny_served.tokenizer.decode(ids)


@pytest.mark.parametrize("best_of", [None, 1, 2])
def test_best_of_equal_to_n_is_n_choices(tiny_served: ServedModel, best_of: int | None) -> None:
    choices = completion_choices(tiny_served, n=2, best_of=best_of, max_tokens=4)
    assert [c.req_id for c in choices] == ["r", "r-1"]


def test_best_of_above_n_is_refused_before_any_choice(tiny_served: ServedModel) -> None:
    with pytest.raises(OpenAIError) as refused:
        completion_choices(tiny_served, n=2, best_of=3)
    assert (refused.value.status, refused.value.param) == (400, "best_of")


def test_a_bad_later_prompt_refuses_the_whole_body(tiny_served: ServedModel) -> None:
    vocab = tiny_served.tokenizer.vocab_size
    with pytest.raises(OpenAIError) as refused:
        completion_choices(tiny_served, prompt=[[1, 2, 3], [1, vocab]])
    assert refused.value.param == "prompt" and f"token id {vocab}" in refused.value.message


def test_prompts_times_n_are_capped(tiny_served: ServedModel) -> None:
    prompts = [[1, 2]] * (MAX_PROMPTS // 2)
    assert len(completion_choices(tiny_served, prompt=prompts, n=2, max_tokens=1)) == MAX_PROMPTS
    with pytest.raises(OpenAIError) as refused:
        completion_choices(tiny_served, prompt=[*prompts, [1, 2]], n=2, max_tokens=1)
    assert refused.value.param == "prompt" and f"at most {MAX_PROMPTS} choices" in refused.value.message


def test_a_new_id_per_body_unless_one_is_given(tiny_served: ServedModel) -> None:
    body = ChatCompletionRequest.model_validate({"messages": USER, "n": 2})
    first = prepare_choices(body, tiny_served, ARRIVAL)
    second = prepare_choices(body, tiny_served, ARRIVAL)
    assert first[0].req_id != second[0].req_id
    assert first[1].req_id == f"{first[0].req_id}-1"


@pytest.mark.parametrize(
    ("fields", "include_usage", "continuous_usage"),
    [
        ({}, False, False),
        ({"stream_options": {"include_usage": True}}, False, False),  # not streamed: the body has usage
        ({"stream": True}, False, False),
        ({"stream": True, "stream_options": {"include_usage": True}}, True, False),
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, False, False),
        (
            {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
            True,
            True,
        ),
    ],
)
def test_usage_in_a_stream_only_when_asked(
    tiny_served: ServedModel, fields: dict[str, Any], include_usage: bool, continuous_usage: bool
) -> None:
    [choice] = chat_choices(tiny_served, **fields)
    assert choice.stream == bool(fields.get("stream"))
    assert (choice.include_usage, choice.continuous_usage) == (include_usage, continuous_usage)


def test_logprobs_asked_reach_the_record_and_the_worker(tiny_served: ServedModel) -> None:
    [chat] = chat_choices(tiny_served, logprobs=True)
    assert chat.logprobs and chat.message.sampling_params.logprobs == 0
    [plain] = chat_choices(tiny_served)
    assert not plain.logprobs and plain.message.sampling_params.logprobs is None
    [echoed] = completion_choices(tiny_served, echo=True, logprobs=3, prompt_logprobs=1, max_tokens=1)
    assert echoed.echo_logprobs and echoed.prompt_logprobs
    # The echo needs 3 top tokens per prompt position, prompt_logprobs 1: the worker computes the most.
    assert echoed.message.sampling_params.prompt_logprobs == 3


def test_the_requests_owner_user_priority_and_deadline(tiny_served: ServedModel) -> None:
    body = ChatCompletionRequest.model_validate(
        {"messages": USER, "user": "u1", "safety_identifier": "s1", "priority": 5}
    )
    [choice] = prepare_choices(body, tiny_served, ARRIVAL, owner="key-1", queue_deadline=ARRIVAL + 30)
    message = choice.message
    assert (message.owner, message.user, message.queue_deadline) == ("key-1", "s1", ARRIVAL + 30)
    assert message.priority == BATCH_PRIORITY and choice.safety_identifier == "s1"
    [line] = prepare_choices(body, tiny_served, ARRIVAL, priority=INTERACTIVE_PRIORITY)
    assert line.message.priority == INTERACTIVE_PRIORITY
    [anonymous] = chat_choices(tiny_served, user="u2")
    assert anonymous.message.user == "u2"
