"""Turns a validated OpenAI body into the GenerateRequest the batcher reads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import msgspec

from common.protocol import GenerateRequest, SamplingParams
from common.stream_client import new_req_id
from openai_frontend.openai_schemas import ChatCompletionRequest, CompletionRequest
from openai_frontend.prompts import chat_prompt_ids, completion_prompt_ids
from openai_frontend.served_model import ServedModel
from openai_frontend.validation import (
    check_model,
    check_prompt_length,
    check_unsupported,
    check_user,
    num_choices,
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
    resumable: bool = False  # outlives its client's connection for the resume window
    n: int = 1  # choices asked for; each is a PreparedRequest of its own (see fan_out)
    logprobs: bool = False  # add logprobs to each choice
    echo_text: str | None = None  # completions with echo: the prompt text that starts each choice
    user: str = ""  # the client's end-user id, recorded with the request
    owner: str = ""  # name of the API key that made it; never the key
    queue_deadline: float | None = None  # unix seconds; the batcher fails it if still unscheduled then
    priority: int = 0  # lower runs first: interactive requests 0, batch lines BATCH_PRIORITY
    # Set when prompt_token_ids holds only the prompt's tail (a request rebuilt to resume its stream).
    full_prompt_len: int | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids) if self.full_prompt_len is None else self.full_prompt_len

    def to_message(self) -> GenerateRequest:
        return GenerateRequest(
            req_id=self.req_id,
            prompt_token_ids=self.prompt_token_ids,
            sampling_params=self.sampling_params,
            arrival_time=self.arrival_time,
            user=self.user,
            owner=self.owner,
            queue_deadline=self.queue_deadline,
            priority=self.priority,
        )


def fan_out(request: PreparedRequest) -> list[PreparedRequest]:
    """One request per choice, each with its own id (`<req_id>-<i>`, as unguessable as the first one's,
    and the same again when a batch line is prepared again); with a seed, choice i uses seed + i (as
    vLLM's ParentRequest does), so every choice is reproducible on its own and they differ."""
    choices = [request]
    for i in range(1, request.n):
        params = request.sampling_params
        if params.seed is not None:
            params = msgspec.structs.replace(params, seed=params.seed + i)
        choices.append(dataclasses.replace(request, req_id=f"{request.req_id}-{i}", sampling_params=params))
    return choices


def prepare_request(
    body: CompletionRequest | ChatCompletionRequest,
    served: ServedModel,
    arrival_time: float,
    *,
    owner: str = "",
    queue_deadline: float | None = None,
    req_id: str | None = None,
    priority: int = 0,
) -> PreparedRequest:
    """Check and tokenize `body`; raises OpenAIError (400/404) on anything it cannot serve.

    `req_id` defaults to a new random id; a batch line passes one derived from its batch and index.
    """
    check_model(body.model, served)
    check_unsupported(body)
    stop = stop_strings(body.stop)
    user = check_user(body.user)
    echo_text: str | None = None
    if isinstance(body, ChatCompletionRequest):
        prompt_token_ids = chat_prompt_ids(body.messages, served)
        logprobs = bool(body.logprobs)
    else:
        prompt_token_ids = completion_prompt_ids(body.prompt, served)
        logprobs = body.logprobs is not None
        if body.echo:
            echo_text = _prompt_text(body.prompt, prompt_token_ids, served)
    prompt_param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    check_prompt_length(len(prompt_token_ids), served, prompt_param)
    max_tokens = resolve_max_tokens(body, len(prompt_token_ids), served)
    return PreparedRequest(
        req_id=req_id or new_req_id(),
        prompt_token_ids=prompt_token_ids,
        sampling_params=sampling_params(body, max_tokens, served),
        stop=stop,
        arrival_time=arrival_time,
        stream=bool(body.stream),
        include_usage=bool(body.stream and body.stream_options and body.stream_options.include_usage),
        resumable=bool(body.resumable),
        return_token_ids=bool(body.return_token_ids),
        n=num_choices(body),
        logprobs=logprobs,
        echo_text=echo_text,
        user=user,
        owner=owner,
        queue_deadline=queue_deadline,
        priority=priority,
    )


def _prompt_text(
    prompt: str | list[int] | list[str] | list[list[int]], token_ids: list[int], served: ServedModel
) -> str:
    """The prompt as the client wrote it; token-id prompts are decoded (special tokens left out)."""
    if isinstance(prompt, str):
        return prompt
    if prompt and isinstance(prompt[0], str):
        return str(prompt[0])
    return served.tokenizer.decode(token_ids)
