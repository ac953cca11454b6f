"""The completions renderer (completions/completion.py) against the OpenAI SDK's `Completion`: bodies and
final chunks validate as `text_completion`s, with the legacy logprobs layout (tokens, token_logprobs,
top_logprobs, text_offset), echoed prompts, usage counting each prompt once, and vLLM's
`prompt_logprobs`. The SDK's type has no null logprob and no null finish_reason, which an echoed
prompt's first token and a stream's middle chunks carry: those are checked field by field."""

from __future__ import annotations

from typing import Any

from openai.types import Completion

from common.protocol import PromptEvent
from openai_frontend.completions.completion import COMPLETION
from openai_frontend.completions.endpoints import ENDPOINTS
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.generate.request_builder import prepare_choices
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.openai_schemas import CompletionRequest
from tests.unit.openai_frontend.completions.completions_inputs import (
    body,
    logprob,
    outputs,
    prompt_output,
    stream,
)

PROMPT = "Once upon a time"


def requests(served: ServedModel, **fields: Any) -> list[PreparedRequest]:
    completion = CompletionRequest.model_validate({"prompt": PROMPT, **fields})
    return prepare_choices(completion, served, 1_700_000_000.0, req_id="r")


def token_text(served: ServedModel, token_id: int) -> str:
    return str(served.tokenizer.tokenizer.decode([token_id], skip_special_tokens=False))


def prompt_event(served: ServedModel, request: PreparedRequest) -> PromptEvent:
    """The prompt's logprobs as the worker sends them: none for its first token, two top ones after."""
    ids = request.message.prompt_token_ids
    return PromptEvent(
        req_id=request.req_id,
        attempt=0,
        token_ids=ids,
        logprobs=[-1.0 - i for i in range(len(ids) - 1)],
        top_token_ids=[[t + 1, t] for t in ids[1:]],  # the prompt's own token second
        top_logprobs=[[-0.5 - i, -1.0 - i] for i in range(len(ids) - 1)],
    )


def test_the_endpoints_by_kind() -> None:
    assert {kind: endpoint.kind for kind, endpoint in ENDPOINTS.items()} == {
        "chat": "chat",
        "completion": "completion",
    }
    assert ENDPOINTS["completion"] is COMPLETION


def test_a_body_counts_each_prompt_once_per_its_choices(tiny_served: ServedModel) -> None:
    choices = requests(tiny_served, prompt=[PROMPT, "The end"], n=2, max_tokens=4)
    texts = [(" there", "length"), (" was", "stop"), (".", "stop"), ("!", "length")]
    outs = [
        outputs(tiny_served, c.req_id, t, f, cached=i)
        for i, (c, (t, f)) in enumerate(zip(choices, texts, strict=True))
    ]
    answer = body(COMPLETION, tiny_served, choices, outs)
    Completion.model_validate(answer)
    assert (answer["object"], answer["id"], answer["model"]) == ("text_completion", "cmpl-r", "tiny")
    assert [(c["index"], c["text"], c["finish_reason"]) for c in answer["choices"]] == [
        (0, " there", "length"),
        (1, " was", "stop"),
        (2, ".", "stop"),
        (3, "!", "length"),
    ]
    assert all(c["logprobs"] is None and "token_ids" not in c for c in answer["choices"])
    prompt = choices[0].num_prompt_tokens + choices[2].num_prompt_tokens
    completion = sum(len(o) for o in outs)
    assert answer["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0 + 2},  # per prompt, the fewest its choices found
    }


def test_logprobs_in_the_legacy_layout(tiny_served: ServedModel) -> None:
    outs = [outputs(tiny_served, "r", " there was", "stop", eos=True)]
    answer = body(COMPLETION, tiny_served, requests(tiny_served, logprobs=2), outs)
    Completion.model_validate(answer)
    logprobs = answer["choices"][0]["logprobs"]
    texts = [token_text(tiny_served, out.token_ids[0]) for out in outs[0]]
    assert logprobs["tokens"] == texts  # the EOS token too, by its text
    assert logprobs["token_logprobs"] == [logprob(i) for i in range(len(texts))]
    assert logprobs["top_logprobs"] == [
        {texts[i]: logprob(i), token_text(tiny_served, out.token_ids[0] + 1): logprob(i) - 1}
        for i, out in enumerate(outs[0])
    ]
    # Each token's first character in the choice's text.
    assert logprobs["text_offset"] == [sum(len(t) for t in texts[:i]) for i in range(len(texts))]


def test_an_echo_starts_each_choice_and_shifts_the_offsets(tiny_served: ServedModel) -> None:
    outs = [outputs(tiny_served, "r", " there", "length")]
    answer = body(COMPLETION, tiny_served, requests(tiny_served, echo=True, max_tokens=4), outs)
    Completion.model_validate(answer)
    assert answer["choices"][0]["text"] == PROMPT + " there"
    chunks = stream(
        COMPLETION, tiny_served, requests(tiny_served, echo=True, stream=True, max_tokens=4), outs
    )
    assert chunks[0]["choices"] == [{"index": 0, "text": PROMPT, "logprobs": None, "finish_reason": None}]
    assert "".join(c["choices"][0]["text"] for c in chunks) == PROMPT + " there"


def test_an_echo_with_logprobs_scores_the_prompt_first(tiny_served: ServedModel) -> None:
    [request] = requests(tiny_served, echo=True, logprobs=2, max_tokens=0)
    prompt = prompt_event(tiny_served, request)
    scored = prompt_output(prompt, "length")
    answer = body(COMPLETION, tiny_served, [request], [[scored]])
    [choice] = answer["choices"]
    texts = [token_text(tiny_served, t) for t in prompt.token_ids]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == texts
    # Nothing precedes the first prompt token: null, as vLLM and lm-eval read it.
    assert logprobs["token_logprobs"] == [None, *prompt.logprobs]
    assert logprobs["top_logprobs"][0] is None
    assert logprobs["top_logprobs"][1] == {
        token_text(tiny_served, prompt.token_ids[1] + 1): -0.5,
        texts[1]: -1.0,
    }
    assert logprobs["text_offset"] == [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    # Streamed: no opening echo; the prompt goes out with its logprobs, as the body has them.
    [chunk] = stream(COMPLETION, tiny_served, [request], [[scored]])
    assert chunk["choices"][0]["text"] == PROMPT and chunk["choices"][0]["logprobs"] == logprobs


def test_prompt_logprobs_are_vllms_per_token_maps(tiny_served: ServedModel) -> None:
    [request] = requests(tiny_served, prompt_logprobs=2, max_tokens=1)
    prompt = prompt_event(tiny_served, request)
    outs = [prompt_output(prompt), *outputs(tiny_served, "r", " there", "length")]
    answer = body(COMPLETION, tiny_served, [request], [outs])
    Completion.model_validate(answer)
    per_token = answer["choices"][0]["prompt_logprobs"]
    ids = prompt.token_ids
    assert len(per_token) == len(ids) and per_token[0] is None
    # The prompt's own token, ranked second among the top ones; then the most likely one.
    assert per_token[1] == {
        str(ids[1]): {"logprob": -1.0, "rank": 2, "decoded_token": token_text(tiny_served, ids[1])},
        str(ids[1] + 1): {"logprob": -0.5, "rank": 1, "decoded_token": token_text(tiny_served, ids[1] + 1)},
    }


def test_a_stream_ends_each_choice_and_then_sends_usage(tiny_served: ServedModel) -> None:
    choices = requests(tiny_served, n=2, stream=True, stream_options={"include_usage": True}, max_tokens=4)
    outs = [outputs(tiny_served, "r", " there", "length"), outputs(tiny_served, "r-1", " was", "stop")]
    *deltas, last = stream(COMPLETION, tiny_served, choices, outs)
    for chunk in deltas:
        assert (chunk["object"], chunk["id"], chunk["usage"]) == ("text_completion", "cmpl-r", None)
        [choice] = chunk["choices"]
        assert set(choice) == {"index", "text", "logprobs", "finish_reason"}
        if choice["finish_reason"] is not None:
            Completion.model_validate(chunk)
    for index, text, finish_reason in ((0, " there", "length"), (1, " was", "stop")):
        mine = [c["choices"][0] for c in deltas if c["choices"][0]["index"] == index]
        assert "".join(c["text"] for c in mine) == text
        assert [c["finish_reason"] for c in mine] == [None] * (len(mine) - 1) + [finish_reason]
    Completion.model_validate(last)
    prompt, completion = choices[0].num_prompt_tokens, len(outs[0]) + len(outs[1])
    assert last["choices"] == [] and last["usage"]["total_tokens"] == prompt + completion
