"""Turns a validated OpenAI body into the GenerateRequest the batcher reads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import msgspec

from common.protocol import GenerateRequest, SamplingParams
from common.stream_client import new_req_id
from openai_frontend.generate.prompts import (
    MAX_PROMPTS,
    chat_prompt_ids,
    completion_prompt_ids,
    split_prompts,
)
from openai_frontend.generate.validation import (
    check_model,
    check_prompt_length,
    check_unsupported,
    check_user,
    num_choices,
    num_logprobs,
    resolve_max_tokens,
    sampling_params,
    stop_strings,
)
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.errors import invalid_request
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest, CompletionRequest
from openai_frontend.tools.tool_choice import ToolUse, tool_use


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
    tool_parser: str | None = None  # chat with tools: the format tool calls are read back in
    max_tool_calls: int | None = None  # 1 with parallel_tool_calls false

    @property
    def echo_logprobs(self) -> bool:
        """Completions with echo and logprobs: the echoed prompt comes with its tokens' logprobs."""
        return self.echo_text is not None and self.logprobs

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


def fan_out(request: PreparedRequest, first_index: int = 0) -> list[PreparedRequest]:
    """One request per choice, each with its own id (`<req_id>-<index>`, as unguessable as the first
    one's, and the same again when a batch line is prepared again); choice indexes start at
    `first_index` (a later prompt of a list). With a seed, choice i of a prompt uses seed + i (as
    vLLM's ParentRequest does), so every choice is reproducible on its own and they differ."""
    choices = []
    for i in range(request.n):
        params = request.sampling_params
        if params.seed is not None and i:
            params = msgspec.structs.replace(params, seed=params.seed + i)
        index = first_index + i
        req_id = f"{request.req_id}-{index}" if index else request.req_id
        choices.append(
            request if not index else dataclasses.replace(request, req_id=req_id, sampling_params=params)
        )
    return choices


def prepare_choices(
    body: CompletionRequest | ChatCompletionRequest,
    served: ServedModel,
    arrival_time: float,
    *,
    owner: str = "",
    queue_deadline: float | None = None,
    req_id: str | None = None,
    priority: int = 0,
) -> list[PreparedRequest]:
    """Every choice of `body`, all checked and tokenized before any is queued: n per prompt (a
    completions body may hold a list of prompts), choice `prompt_index * n + i` as OpenAI and vLLM
    number them. Raises OpenAIError (400/404) on anything it cannot serve.

    `req_id` defaults to a new random id; a batch line passes one derived from its batch and index.
    """
    check_model(body.model, served)
    check_unsupported(body)
    stop = stop_strings(body.stop)
    user = check_user(body.user)
    n = num_choices(body)
    req_id = req_id or new_req_id()
    tools = tool_use(body, served) if isinstance(body, ChatCompletionRequest) else ToolUse()
    choices: list[PreparedRequest] = []
    for prompt_token_ids, echo_text in _prompts(body, n, served, tools):
        prompt_param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        check_prompt_length(len(prompt_token_ids), served, prompt_param)
        max_tokens = resolve_max_tokens(body, len(prompt_token_ids), served)
        request = PreparedRequest(
            req_id=req_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=sampling_params(body, max_tokens, served, tools.grammar),
            stop=stop,
            arrival_time=arrival_time,
            stream=bool(body.stream),
            include_usage=bool(body.stream and body.stream_options and body.stream_options.include_usage),
            resumable=bool(body.resumable),
            return_token_ids=bool(body.return_token_ids),
            n=n,
            logprobs=num_logprobs(body) is not None,
            echo_text=echo_text,
            user=user,
            owner=owner,
            queue_deadline=queue_deadline,
            priority=priority,
            tool_parser=tools.parser,
            max_tool_calls=tools.max_calls,
        )
        choices += fan_out(request, len(choices))
    return choices


def _prompts(
    body: CompletionRequest | ChatCompletionRequest, n: int, served: ServedModel, tools: ToolUse
) -> list[tuple[list[int], str | None]]:
    """Each prompt's token ids, and with echo the text each of its choices starts with."""
    if isinstance(body, ChatCompletionRequest):
        return [(chat_prompt_ids(body.messages, served, tools.tools), None)]
    prompts = split_prompts(body.prompt)
    if len(prompts) * n > MAX_PROMPTS:
        raise invalid_request(f"at most {MAX_PROMPTS} choices (prompts x n) per request", "prompt")
    result = []
    for prompt in prompts:
        token_ids = completion_prompt_ids(prompt, served)
        echo_text = None
        if body.echo:  # as the client wrote it; token ids decoded (special tokens left out)
            echo_text = prompt if isinstance(prompt, str) else served.tokenizer.decode(token_ids)
        result.append((token_ids, echo_text))
    return result
