"""Turns a validated OpenAI body into its requests' records (request.py): one per choice."""

from __future__ import annotations

import msgspec

from common.protocol import GenerateRequest, LoRARequest, MultiModalFeature
from common.stream_client import new_req_id
from openai_frontend.generate.image_prompts import ChatPrompt, image_chat_prompt
from openai_frontend.generate.options import (
    checked_metadata,
    num_prompt_logprobs,
    priority_level,
    template_variables,
    truncated,
)
from openai_frontend.generate.prompts import (
    MAX_PROMPTS,
    chat_prompt_ids,
    completion_prompt_ids,
    split_prompts,
)
from openai_frontend.generate.request import PreparedRequest, with_message
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
from openai_frontend.model.chat_template import ChatRender, template_reads
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.errors import invalid_request
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest, CompletionRequest
from openai_frontend.reasoning.grammar import after_thoughts
from openai_frontend.reasoning.request import harmony_markers, thinking
from openai_frontend.tools.tool_choice import ToolUse, tool_use


def fan_out(request: PreparedRequest, first_index: int = 0) -> list[PreparedRequest]:
    """One request per choice, each with its own id (`<req_id>-<index>`, as unguessable as the first
    one's, and the same again when a batch line is prepared again); choice indexes start at
    `first_index` (a later prompt of a list). With a seed, choice i of a prompt uses seed + i (as
    vLLM's ParentRequest does), so every choice is reproducible on its own and they differ."""
    choices = []
    for i in range(request.n):
        params = request.message.sampling_params
        if params.seed is not None and i:
            params = msgspec.structs.replace(params, seed=params.seed + i)
        index = first_index + i
        req_id = f"{request.req_id}-{index}" if index else request.req_id
        choices.append(request if not index else with_message(request, req_id=req_id, sampling_params=params))
    return choices


def prepare_choices(
    body: CompletionRequest | ChatCompletionRequest,
    served: ServedModel,
    arrival_time: float,
    *,
    owner: str = "",
    queue_deadline: float | None = None,
    req_id: str | None = None,
    priority: int | None = None,
    lora_request: LoRARequest | None = None,
) -> list[PreparedRequest]:
    """Every choice of `body`, all checked and tokenized before any is queued: n per prompt (a
    completions body may hold a list of prompts), choice `prompt_index * n + i` as OpenAI and vLLM
    number them. Raises OpenAIError (400/404) on anything it cannot serve.

    `served` is the base model `body.model` names, or the one under `lora_request`, the adapter it
    names (openai_frontend/model/model_target.py resolves which). `req_id` defaults to a new random
    id; a batch line passes one derived from its batch and index, and its own `priority` (else the
    body's `priority` picks the level).
    """
    if lora_request is None:
        check_model(body.model, served)
    check_unsupported(body)
    stop = stop_strings(body.stop)
    user = check_user(body.user)
    safety_identifier = check_user(body.safety_identifier, "safety_identifier")
    metadata = checked_metadata(body.metadata)
    level = priority_level(body) if priority is None else priority
    k_prompt = num_prompt_logprobs(body)
    n = num_choices(body)
    req_id = req_id or new_req_id()
    tools = tool_use(body, served) if isinstance(body, ChatCompletionRequest) else ToolUse()
    choices: list[PreparedRequest] = []
    for prompt_token_ids, echo_text, mm_features in _prompts(body, n, served, tools):
        whole = len(prompt_token_ids)
        prompt_token_ids = truncated(prompt_token_ids, body, served.rules.max_model_len)
        if mm_features and len(prompt_token_ids) != whole:
            raise invalid_request(
                "truncate_prompt_tokens cannot cut a prompt that holds images", "truncate_prompt_tokens"
            )
        prompt_param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        check_prompt_length(len(prompt_token_ids), served, prompt_param)
        max_tokens = resolve_max_tokens(body, len(prompt_token_ids), served)
        params = sampling_params(body, max_tokens, served, tools.grammar)
        if k_prompt is not None:
            params = msgspec.structs.replace(
                params, prompt_logprobs=max(k_prompt, params.prompt_logprobs or 0)
            )
        think = thinking(served, isinstance(body, ChatCompletionRequest), prompt_token_ids)
        message = GenerateRequest(
            req_id=req_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=after_thoughts(params, think, forced_calls=tools.grammar is not None),
            arrival_time=arrival_time,
            user=safety_identifier or user,  # OpenAI's newer name for the end user wins
            owner=owner,
            queue_deadline=queue_deadline,
            priority=level,
            lora_request=lora_request,
            mm_features=mm_features,
        )
        include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
        request = PreparedRequest(
            message=message,
            kind="chat" if isinstance(body, ChatCompletionRequest) else "completion",
            model=served.rules.name if lora_request is None else lora_request.lora_name,
            base_model_name=None if lora_request is None else served.rules.name,
            num_prompt_tokens=len(prompt_token_ids),
            stop=stop,
            stream=bool(body.stream),
            include_usage=include_usage,
            resumable=bool(body.resumable),
            return_token_ids=bool(body.return_token_ids),
            n=n,
            logprobs=num_logprobs(body) is not None,
            echo_text=echo_text,
            tool_parser=tools.parser,
            max_tool_calls=tools.max_calls,
            tool_strings=tools.strings,
            **think,
            # Harmony's markers are gpt-oss's special tokens: its parsers read them in the text.
            skip_special_tokens=body.skip_special_tokens is not False
            and not harmony_markers(tools.parser, think),
            include_stop_str_in_output=bool(body.include_stop_str_in_output),
            # As vLLM: usage on every chunk only for a stream that asked for usage at all.
            continuous_usage=include_usage
            and bool(body.stream_options and body.stream_options.continuous_usage_stats),
            prompt_logprobs=k_prompt is not None,
            metadata=metadata,
            safety_identifier=safety_identifier,
            store=bool(body.store),
        )
        choices += fan_out(request, len(choices))
    return choices


def _prompts(
    body: CompletionRequest | ChatCompletionRequest, n: int, served: ServedModel, tools: ToolUse
) -> list[tuple[list[int], str | None, list[MultiModalFeature] | None]]:
    """Each prompt's token ids, with echo the text each of its choices starts with, and its images."""
    if isinstance(body, ChatCompletionRequest):
        chat = _chat_prompt(body, served, tools)
        return [(chat.token_ids, None, chat.mm_features)]
    prompts = split_prompts(body.prompt)
    if len(prompts) * n > MAX_PROMPTS:
        raise invalid_request(f"at most {MAX_PROMPTS} choices (prompts x n) per request", "prompt")
    result: list[tuple[list[int], str | None, list[MultiModalFeature] | None]] = []
    for prompt in prompts:
        token_ids = completion_prompt_ids(prompt, served, body.add_special_tokens is not False)
        echo_text = None
        if body.echo:  # as the client wrote it; token ids decoded (special tokens left out)
            echo_text = prompt if isinstance(prompt, str) else served.tokenizer.decode(token_ids)
        result.append((token_ids, echo_text, None))
    return result


def _chat_prompt(body: ChatCompletionRequest, served: ServedModel, tools: ToolUse) -> ChatPrompt:
    """A chat body's prompt: through the model's processor for a vision-language model (images
    allowed), through the tokenizer for a text model (images refused by name)."""
    render = _render(body, served)
    if served.vision is not None:
        return image_chat_prompt(
            body.messages, served, served.vision, tools.tools, render, body.add_special_tokens
        )
    return ChatPrompt(
        chat_prompt_ids(body.messages, served, tools.tools, render, bool(body.add_special_tokens))
    )


def _render(body: ChatCompletionRequest, served: ServedModel) -> ChatRender:
    """The request's template controls (vLLM's): generation prompt, continuing the last message, and
    the template's extra variables."""
    template = served.tokenizer.chat_template
    reads = template_reads(template) if template is not None else frozenset()
    add_generation_prompt = body.add_generation_prompt is not False
    if body.continue_final_message and add_generation_prompt:
        raise invalid_request(
            "continue_final_message and add_generation_prompt cannot both be true: set "
            "add_generation_prompt to false to continue the last message",
            "continue_final_message",
        )
    return ChatRender(
        add_generation_prompt=add_generation_prompt,
        continue_final_message=bool(body.continue_final_message),
        variables=template_variables(body, reads),
    )


def chat_prompt_of(body: ChatCompletionRequest, served: ServedModel) -> ChatPrompt:
    """The prompt a chat body queues (template controls and tools included): its token ids, for
    /tokenize, and its images (the offline LLM's chat)."""
    return _chat_prompt(body, served, tool_use(body, served))


def prompt_ids_of(body: ChatCompletionRequest, served: ServedModel) -> list[int]:
    """The token ids a chat body queues, for /tokenize and count_tokens."""
    return chat_prompt_of(body, served).token_ids
