"""Turns a validated OpenAI body into the GenerateRequest the batcher reads."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from common.protocol import GenerateRequest, SamplingParams
from gateway.openai_schemas import ChatCompletionRequest, CompletionRequest
from gateway.prompts import chat_prompt_ids, completion_prompt_ids
from gateway.served_model import ServedModel
from gateway.validation import (
    check_model,
    check_unsupported,
    resolve_max_tokens,
    sampling_params,
    stop_strings,
)


@dataclass(slots=True, frozen=True)
class PreparedRequest:
    req_id: str  # unguessable: it names the token stream, which anyone holding it can read
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    stop: list[str]  # matched here on the output text, never sent to the worker
    arrival_time: float  # unix seconds
    stream: bool
    include_usage: bool  # streaming: add a final usage chunk
    return_token_ids: bool = False  # add generated token ids to each choice

    def to_message(self) -> GenerateRequest:
        return GenerateRequest(
            req_id=self.req_id,
            prompt_token_ids=self.prompt_token_ids,
            sampling_params=self.sampling_params,
            arrival_time=self.arrival_time,
        )


def new_req_id() -> str:
    return secrets.token_hex(16)


def prepare_request(
    body: CompletionRequest | ChatCompletionRequest, served: ServedModel, arrival_time: float
) -> PreparedRequest:
    """Check and tokenize `body`; raises OpenAIError (400/404) on anything it cannot serve."""
    check_model(body.model, served)
    check_unsupported(body)
    stop = stop_strings(body.stop)
    if isinstance(body, ChatCompletionRequest):
        prompt_token_ids = chat_prompt_ids(body.messages, served)
    else:
        prompt_token_ids = completion_prompt_ids(body.prompt, served)
    max_tokens = resolve_max_tokens(body, len(prompt_token_ids), served)
    return PreparedRequest(
        req_id=new_req_id(),
        prompt_token_ids=prompt_token_ids,
        sampling_params=sampling_params(body, max_tokens, served),
        stop=stop,
        arrival_time=arrival_time,
        stream=bool(body.stream),
        include_usage=bool(body.stream and body.stream_options and body.stream_options.include_usage),
        return_token_ids=bool(body.return_token_ids),
    )
