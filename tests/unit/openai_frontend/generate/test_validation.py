"""The value checks on OpenAI bodies (generate/validation.py), called directly: each rule's edge that
passes and the first value past it, refused as OpenAI refuses, a 400 whose error object names the
parameter (and a code where OpenAI gives one). The HTTP stack tests cover the same refusals end to
end; these pin each bound without a server."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from openai.types import ErrorObject

from openai_frontend.generate import validation
from openai_frontend.model.served_model import ModelRules, ServedModel
from openai_frontend.protocol.errors import OpenAIError
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest, CompletionRequest

USER = [{"role": "user", "content": "hi"}]
INT64_MAX = 2**63 - 1


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": USER, **fields})


def completion(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": "hi", **fields})


def refused(check: Callable[..., object], *args: Any, status: int = 400) -> dict[str, Any]:
    """The error object `check(*args)` raises, checked against the OpenAI SDK's own type of it."""
    with pytest.raises(OpenAIError) as raised:
        check(*args)
    assert raised.value.status == status
    body = raised.value.body()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    ErrorObject.model_validate(body["error"])
    assert body["error"]["type"] == "invalid_request_error"
    return dict(body["error"])


def test_the_model_is_the_served_name_its_directory_or_left_out(
    tiny_served: ServedModel, tiny_model_dir: Path
) -> None:
    for name in (None, "tiny", str(tiny_model_dir), str(tiny_model_dir) + "/", tiny_model_dir.name):
        validation.check_model(name, tiny_served)
    error = refused(validation.check_model, "gpt-4o", tiny_served, status=404)
    assert error["param"] == "model" and error["code"] == "model_not_found"
    assert "`gpt-4o`" in error["message"] and "`tiny`" in error["message"]


@pytest.mark.parametrize("best_of", [None, 1, 3])
def test_best_of_is_accepted_only_where_it_ranks_nothing(best_of: int | None) -> None:
    validation.check_unsupported(completion(n=3, best_of=best_of))


def test_best_of_above_n_is_refused() -> None:
    error = refused(validation.check_unsupported, completion(n=2, best_of=4))
    assert (
        error["param"] == "best_of" and error["code"] is None and "best_of must equal n" in error["message"]
    )


@pytest.mark.parametrize(
    ("body", "accepted", "refused_value", "param"),
    [
        (completion, {"service_tier": "auto"}, {"service_tier": "flex"}, "service_tier"),
        (completion, {"service_tier": "default"}, {"service_tier": "priority"}, "service_tier"),
        (completion, {"suffix": ""}, {"suffix": "tail"}, "suffix"),
        (completion, {"store": False}, {"store": True}, "store"),
        (chat, {"service_tier": "auto"}, {"service_tier": "scale"}, "service_tier"),
        (chat, {"functions": []}, {"functions": [{"name": "f"}]}, "functions"),
        (chat, {"function_call": "none"}, {"function_call": "auto"}, "function_call"),
        (chat, {"modalities": ["text"]}, {"modalities": ["text", "audio"]}, "modalities"),
        (chat, {"audio": None}, {"audio": {"voice": "alloy"}}, "audio"),
        (chat, {"prediction": None}, {"prediction": {"type": "content"}}, "prediction"),
        (chat, {"web_search_options": None}, {"web_search_options": {}}, "web_search_options"),
    ],
)
def test_unimplemented_fields_are_refused_by_name_unless_they_ask_for_the_default(
    body: Callable[..., Any], accepted: dict[str, Any], refused_value: dict[str, Any], param: str
) -> None:
    validation.check_unsupported(body(**accepted))
    error = refused(validation.check_unsupported, body(**refused_value))
    assert error == {
        "message": f"{param} is not supported by this server",
        "type": "invalid_request_error",
        "param": param,
        "code": "unsupported_parameter",
    }


@pytest.mark.parametrize("field", ["function_call", "refusal", "audio"])
def test_unimplemented_message_fields_are_refused_with_the_message_index(field: str) -> None:
    value = "no" if field == "refusal" else {"name": "f", "arguments": "{}"}
    messages = [*USER, {"role": "assistant", "content": "x", field: value}]
    error = refused(
        validation.check_unsupported, ChatCompletionRequest.model_validate({"messages": messages})
    )
    assert error["param"] == f"messages[1].{field}" and error["code"] == "unsupported_parameter"


def test_n_defaults_to_one_and_is_bounded() -> None:
    assert validation.num_choices(chat(n=None)) == 1
    assert validation.num_choices(completion(n=validation.MAX_N)) == validation.MAX_N
    for n in (0, validation.MAX_N + 1):
        error = refused(validation.num_choices, chat(n=n))
        assert (
            error["param"] == "n"
            and f"[1, {validation.MAX_N}]" in error["message"]
            and str(n) in error["message"]
        )


def test_completion_logprobs_count_the_top_tokens() -> None:
    assert validation.num_logprobs(completion()) is None
    assert validation.num_logprobs(completion(logprobs=0)) == 0
    assert validation.num_logprobs(completion(logprobs=validation.MAX_LOGPROBS)) == validation.MAX_LOGPROBS
    for k in (-1, validation.MAX_LOGPROBS + 1):
        error = refused(validation.num_logprobs, completion(logprobs=k))
        assert error["param"] == "logprobs" and f"[0, {validation.MAX_LOGPROBS}]" in error["message"]


def test_chat_logprobs_are_a_switch_and_top_logprobs_a_count() -> None:
    assert validation.num_logprobs(chat()) is None
    assert validation.num_logprobs(chat(logprobs=False)) is None
    assert validation.num_logprobs(chat(logprobs=True)) == 0
    assert (
        validation.num_logprobs(chat(logprobs=True, top_logprobs=validation.MAX_LOGPROBS))
        == validation.MAX_LOGPROBS
    )
    error = refused(validation.num_logprobs, chat(top_logprobs=2))
    assert error["param"] == "top_logprobs" and "needs logprobs" in error["message"]
    error = refused(validation.num_logprobs, chat(logprobs=True, top_logprobs=validation.MAX_LOGPROBS + 1))
    assert error["param"] == "top_logprobs"


def test_stop_is_a_string_or_a_bounded_list_of_non_empty_ones() -> None:
    assert validation.stop_strings(None) == []
    assert validation.stop_strings("END") == ["END"]
    assert validation.stop_strings(["s"] * validation.MAX_STOP_STRINGS) == ["s"] * validation.MAX_STOP_STRINGS
    assert validation.stop_strings(["x" * validation.MAX_STOP_STRING_CHARS]) == [
        "x" * validation.MAX_STOP_STRING_CHARS
    ]
    for stop, says in (
        (["s"] * (validation.MAX_STOP_STRINGS + 1), f"at most {validation.MAX_STOP_STRINGS} stop strings"),
        (["ok", ""], "must not be empty"),
        ("", "must not be empty"),
        (
            ["x" * (validation.MAX_STOP_STRING_CHARS + 1)],
            f"at most {validation.MAX_STOP_STRING_CHARS} characters",
        ),
    ):
        error = refused(validation.stop_strings, stop)
        assert error["param"] == "stop" and says in error["message"]


def test_an_end_user_id_is_bounded_under_its_own_name() -> None:
    assert validation.check_user(None) == ""
    assert validation.check_user("u" * validation.MAX_USER_CHARS) == "u" * validation.MAX_USER_CHARS
    assert refused(validation.check_user, "u" * (validation.MAX_USER_CHARS + 1))["param"] == "user"
    error = refused(validation.check_user, "u" * (validation.MAX_USER_CHARS + 1), "safety_identifier")
    assert error["param"] == "safety_identifier"


def test_the_operators_prompt_cap(tiny_served: ServedModel) -> None:
    validation.check_prompt_length(10_000, tiny_served, "prompt")  # no cap
    rules = ModelRules(name="t", max_model_len=512, max_prompt_tokens=8)
    capped = ServedModel(rules=rules, root="", tokenizer=tiny_served.tokenizer)
    validation.check_prompt_length(8, capped, "prompt")
    error = refused(validation.check_prompt_length, 9, capped, "messages")
    assert error["param"] == "messages" and error["code"] == "prompt_too_long"
    assert "9 tokens" in error["message"] and "at most 8" in error["message"]


def test_max_tokens_defaults_to_the_room_left_or_the_operators_cap(tiny_served: ServedModel) -> None:
    assert validation.resolve_max_tokens(chat(), 500, tiny_served) == 12
    assert validation.resolve_max_tokens(chat(max_tokens=12), 500, tiny_served) == 12
    rules = ModelRules(name="t", max_model_len=512, max_tokens=64)
    capped = ServedModel(rules=rules, root="", tokenizer=tiny_served.tokenizer)
    assert validation.resolve_max_tokens(chat(), 10, capped) == 64
    assert validation.resolve_max_tokens(chat(), 500, capped) == 12
    error = refused(validation.resolve_max_tokens, chat(max_tokens=65), 10, capped)
    assert error["param"] == "max_tokens" and "at most 64" in error["message"]


def test_a_completion_may_generate_nothing_a_chat_may_not(tiny_served: ServedModel) -> None:
    assert validation.resolve_max_tokens(completion(max_tokens=0), 10, tiny_served) == 0
    error = refused(validation.resolve_max_tokens, chat(max_tokens=0), 10, tiny_served)
    assert error["param"] == "max_tokens" and "at least 1" in error["message"]
    error = refused(validation.resolve_max_tokens, completion(max_tokens=-1), 10, tiny_served)
    assert error["param"] == "max_tokens" and "at least 0" in error["message"]


def test_max_completion_tokens_wins_over_max_tokens_and_is_the_one_named(tiny_served: ServedModel) -> None:
    assert validation.resolve_max_tokens(chat(max_tokens=100, max_completion_tokens=7), 10, tiny_served) == 7
    error = refused(
        validation.resolve_max_tokens, chat(max_tokens=5, max_completion_tokens=0), 10, tiny_served
    )
    assert error["param"] == "max_completion_tokens"


def test_prompt_and_output_past_the_context_are_refused_as_openai_words_it(tiny_served: ServedModel) -> None:
    error = refused(validation.resolve_max_tokens, chat(max_tokens=13), 500, tiny_served)
    assert error["param"] == "max_tokens" and error["code"] == "context_length_exceeded"
    assert error["message"].startswith("This model's maximum context length is 512 tokens. However, you ")
    assert "requested 513 tokens (500 in the prompt, 13 in the completion)" in error["message"]
    for body, param in ((chat(), "messages"), (completion(), "prompt")):
        error = refused(validation.resolve_max_tokens, body, 512, tiny_served)
        assert error["param"] == param and error["code"] == "context_length_exceeded"
        assert "leaves no room for output" in error["message"]


def test_sampling_defaults_are_openais(tiny_served: ServedModel) -> None:
    params = validation.sampling_params(chat(), 16, tiny_served)
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (1.0, 1.0, 0, None)
    assert (params.min_p, params.presence_penalty, params.frequency_penalty) == (0.0, 0.0, 0.0)
    assert (params.repetition_penalty, params.logit_bias, params.min_tokens) == (1.0, {}, 0)
    assert (params.max_tokens, params.logprobs, params.prompt_logprobs) == (16, None, None)
    assert params.stop_token_ids == [] and not params.ignore_eos and params.structured_output is None


# (field, values accepted as given, values refused, words the refusal quotes)
RANGES: list[tuple[str, list[float], list[float], str]] = [
    ("temperature", [0.0, 2.0], [-0.1, 2.01, math.nan], "[0, 2.0]"),
    ("top_p", [1e-9, 1.0], [0.0, 1.01, math.nan], "(0, 1]"),
    ("min_p", [0.0, 1.0], [-0.01, 1.01, math.nan], "[0, 1]"),
    ("presence_penalty", [-2.0, 2.0], [-2.01, 2.01], "[-2, 2]"),
    ("frequency_penalty", [-2.0, 2.0], [-2.01, 2.01, math.nan], "[-2, 2]"),
    ("repetition_penalty", [0.01, 1.5], [0.0, -1.0, math.inf, math.nan], "finite number > 0"),
]


@pytest.mark.parametrize(("field", "good", "bad", "says"), RANGES, ids=[r[0] for r in RANGES])
def test_sampling_ranges(
    tiny_served: ServedModel, field: str, good: list[float], bad: list[float], says: str
) -> None:
    for value in good:
        assert getattr(validation.sampling_params(chat(**{field: value}), 16, tiny_served), field) == value
    for value in bad:
        error = refused(validation.sampling_params, chat(**{field: value}), 16, tiny_served)
        assert error["param"] == field and says in error["message"], error


def test_top_k_off_is_zero_whatever_spelling_turns_it_off(tiny_served: ServedModel) -> None:
    vocab = tiny_served.tokenizer.vocab_size
    for top_k, kept in ((-1, 0), (0, 0), (1, 1), (vocab - 1, vocab - 1), (vocab, 0), (vocab + 9, 0)):
        assert validation.sampling_params(chat(top_k=top_k), 16, tiny_served).top_k == kept
    assert refused(validation.sampling_params, chat(top_k=-2), 16, tiny_served)["param"] == "top_k"


def test_a_seed_leaves_room_for_one_per_choice(tiny_served: ServedModel) -> None:
    assert validation.sampling_params(chat(seed=-(2**63)), 16, tiny_served).seed == -(2**63)
    assert validation.sampling_params(chat(seed=INT64_MAX), 16, tiny_served).seed == INT64_MAX
    assert validation.sampling_params(chat(seed=INT64_MAX - 2, n=3), 16, tiny_served).seed == INT64_MAX - 2
    for body in (chat(seed=2**63), chat(seed=-(2**63) - 1), chat(seed=INT64_MAX - 1, n=3)):
        error = refused(validation.sampling_params, body, 16, tiny_served)
        assert error["param"] == "seed" and "64-bit" in error["message"]


def test_stop_token_ids_are_bounded_and_in_the_vocabulary(tiny_served: ServedModel) -> None:
    vocab = tiny_served.tokenizer.vocab_size
    ids = [0, vocab - 1]
    assert validation.sampling_params(chat(stop_token_ids=ids), 16, tiny_served).stop_token_ids == ids
    for bad in ([vocab], [-1], [0] * (validation.MAX_STOP_TOKEN_IDS + 1)):
        error = refused(validation.sampling_params, chat(stop_token_ids=bad), 16, tiny_served)
        assert error["param"] == "stop_token_ids"
    error = refused(validation.sampling_params, chat(stop_token_ids=[vocab]), 16, tiny_served)
    assert f"token id {vocab} is outside the vocabulary [0, {vocab})" == error["message"]


def test_min_tokens_fit_under_max_tokens(tiny_served: ServedModel) -> None:
    assert validation.sampling_params(chat(min_tokens=16), 16, tiny_served).min_tokens == 16
    for value in (-1, 17):
        error = refused(validation.sampling_params, chat(min_tokens=value), 16, tiny_served)
        assert error["param"] == "min_tokens" and "max_tokens=16" in error["message"]


def test_logit_bias_maps_token_ids_to_bounded_biases(tiny_served: ServedModel) -> None:
    vocab = tiny_served.tokenizer.vocab_size
    bias = {"0": -100.0, str(vocab - 1): 100.0}
    assert validation.sampling_params(chat(logit_bias=bias), 16, tiny_served).logit_bias == {
        0: -100.0,
        vocab - 1: 100.0,
    }
    for bad, says in (
        ({"hello": 1.0}, "keys must be token ids"),
        ({str(vocab): 1.0}, "outside the vocabulary"),
        ({"5": 100.5}, "[-100, 100]"),
        ({"5": -101.0}, "[-100, 100]"),
        (
            {str(i): 1.0 for i in range(validation.MAX_LOGIT_BIAS_ENTRIES + 1)},
            f"at most {validation.MAX_LOGIT_BIAS_ENTRIES}",
        ),
    ):
        error = refused(validation.sampling_params, chat(logit_bias=bad), 16, tiny_served)
        assert error["param"] == "logit_bias" and says in error["message"], error


def test_logprobs_reach_the_worker_and_an_echo_scores_the_prompt(tiny_served: ServedModel) -> None:
    assert validation.sampling_params(chat(logprobs=True, top_logprobs=3), 16, tiny_served).logprobs == 3
    plain = validation.sampling_params(completion(logprobs=2), 16, tiny_served)
    assert (plain.logprobs, plain.prompt_logprobs) == (2, None)
    echoed = validation.sampling_params(completion(logprobs=2, echo=True), 16, tiny_served)
    assert (echoed.logprobs, echoed.prompt_logprobs) == (2, 2)
