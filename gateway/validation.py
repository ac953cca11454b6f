"""Value checks on OpenAI request bodies, each failure a 400 that names the parameter."""

from __future__ import annotations

from common.protocol import SamplingParams
from gateway.errors import OpenAIError, invalid_request
from gateway.openai_schemas import ChatCompletionRequest, CompletionRequest
from gateway.served_model import ServedModel

# Bounds that keep values inside what msgpack and the sampler can hold.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
MAX_TEMPERATURE = 2.0


def check_model(requested: str | None, served: ServedModel) -> None:
    if requested is not None and requested != served.name:
        raise OpenAIError(
            404,
            f"The model `{requested}` does not exist; this server serves `{served.name}`.",
            param="model",
            code="model_not_found",
        )


def check_unsupported(body: CompletionRequest | ChatCompletionRequest) -> None:
    """Features that would silently change the answer if ignored are refused until they exist."""
    if body.n not in (None, 1):
        raise invalid_request("n must be 1; several choices per request are not supported yet", "n")
    if isinstance(body, CompletionRequest):
        if body.echo:
            raise invalid_request("echo is not supported yet", "echo")
        if body.logprobs is not None:
            raise invalid_request("logprobs are not supported yet", "logprobs")
        if body.best_of not in (None, 1):
            raise invalid_request("best_of must be 1; it is not supported yet", "best_of")
        if body.suffix:
            raise invalid_request("suffix is not supported yet", "suffix")
    else:
        if body.logprobs:
            raise invalid_request("logprobs are not supported yet", "logprobs")
        if body.top_logprobs:
            raise invalid_request("top_logprobs are not supported yet", "top_logprobs")


def stop_strings(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(s == "" for s in stops):
        raise invalid_request("stop strings must not be empty", "stop")
    return stops


def _requested_max_tokens(body: CompletionRequest | ChatCompletionRequest) -> tuple[int | None, str]:
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        return body.max_completion_tokens, "max_completion_tokens"
    return body.max_tokens, "max_tokens"


def resolve_max_tokens(
    body: CompletionRequest | ChatCompletionRequest, num_prompt_tokens: int, served: ServedModel
) -> int:
    """max_tokens as asked, or all the room the context has left; 400 when prompt + output cannot fit."""
    max_tokens, param = _requested_max_tokens(body)
    if max_tokens is not None and max_tokens < 1:
        raise invalid_request(f"{param} must be at least 1, got {max_tokens}", param)
    room = served.max_model_len - num_prompt_tokens
    prompt_param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    if room < 1:
        raise invalid_request(
            f"This model's maximum context length is {served.max_model_len} tokens, and the prompt has "
            f"{num_prompt_tokens} tokens, which leaves no room for output. Please shorten the prompt.",
            prompt_param,
            "context_length_exceeded",
        )
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise invalid_request(
            f"This model's maximum context length is {served.max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, {max_tokens} in "
            f"the completion). Please reduce the length of the prompt or {param}.",
            param,
            "context_length_exceeded",
        )
    return max_tokens


def sampling_params(
    body: CompletionRequest | ChatCompletionRequest, max_tokens: int, served: ServedModel
) -> SamplingParams:
    temperature = 1.0 if body.temperature is None else body.temperature
    if not 0.0 <= temperature <= MAX_TEMPERATURE:  # also rejects NaN
        raise invalid_request(
            f"temperature must be in [0, {MAX_TEMPERATURE}], got {temperature}", "temperature"
        )
    top_p = 1.0 if body.top_p is None else body.top_p
    if not 0.0 < top_p <= 1.0:
        raise invalid_request(f"top_p must be in (0, 1], got {top_p}", "top_p")
    top_k = 0 if body.top_k is None else body.top_k
    if top_k < -1:
        raise invalid_request(f"top_k must be -1 or 0 (off) or at least 1, got {top_k}", "top_k")
    # -1 is OpenAI-compatible servers' "off"; k >= vocab keeps every token, which is also off.
    if top_k == -1 or top_k >= served.tokenizer.vocab_size:
        top_k = 0
    if body.seed is not None and not _INT64_MIN <= body.seed <= _INT64_MAX:
        raise invalid_request("seed must fit in a signed 64-bit integer", "seed")
    stop_token_ids = list(body.stop_token_ids or [])
    check_token_ids(stop_token_ids, served, "stop_token_ids")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=body.seed,
        stop_token_ids=stop_token_ids,
        ignore_eos=bool(body.ignore_eos),
    )


def check_token_ids(token_ids: list[int], served: ServedModel, param: str) -> None:
    vocab_size = served.tokenizer.vocab_size
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise invalid_request(f"token id {bad} is outside the vocabulary [0, {vocab_size})", param)
