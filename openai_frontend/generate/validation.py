"""Value checks on OpenAI request bodies, each failure a 400 that names the parameter."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

from common.protocol import SamplingParams, StructuredOutput
from openai_frontend.model.served_model import ServedModel
from openai_frontend.model.served_models import ServedModels
from openai_frontend.protocol.errors import invalid_request
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest, CompletionRequest
from openai_frontend.structured.constraint import structured_output

# Bounds that keep values inside what msgpack and the sampler can hold.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
MAX_TEMPERATURE = 2.0
MAX_N = 16  # choices per request; each is a request of its own in the batcher
MAX_LOGPROBS = 20  # most likely tokens returned per position (vLLM's default max_logprobs)
MAX_PENALTY = 2.0  # presence / frequency, as OpenAI bounds them
MAX_LOGIT_BIAS = 100.0
# Sizes of lists a client sends; the body-size limit bounds them too, these keep per-token work small.
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256  # streaming holds back this many characters minus one
MAX_STOP_TOKEN_IDS = 256
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_USER_CHARS = 256  # the OpenAI `user` id is stored with the request


def check_model(requested: str | None, served: ServedModel) -> None:
    """The served name, or the model directory's path where the server accepts it (never listed)."""
    ServedModels([served]).get(requested)


# OpenAI fields this server does not implement, with the values that ask for what it does anyway
# (null always does). Anything else is refused by name: an ignored field would change the answer (or its
# billing, storage, safety checks) without the client knowing.
_UNSUPPORTED_COMMON: dict[str, tuple[Any, ...]] = {
    "service_tier": ("auto", "default"),
}
_UNSUPPORTED_CHAT: dict[str, tuple[Any, ...]] = {
    **_UNSUPPORTED_COMMON,
    "functions": ([],),
    "function_call": ("none",),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "web_search_options": (),
}
# Stored completions are chat's (GET /v1/chat/completions/{id}); OpenAI stores no legacy completion.
_UNSUPPORTED_COMPLETION: dict[str, tuple[Any, ...]] = {
    **_UNSUPPORTED_COMMON,
    "suffix": ("",),
    "store": (False,),
}
_UNSUPPORTED_MESSAGE = ("function_call", "refusal", "audio")


def check_unsupported(body: CompletionRequest | ChatCompletionRequest) -> None:
    """Features that would silently change the answer if ignored are refused until they exist."""
    if isinstance(body, CompletionRequest):
        if body.best_of not in (None, 1, num_choices(body)):
            raise invalid_request(
                "best_of must equal n; ranking extra candidates is not supported", "best_of"
            )
        _refuse_unsupported(body, _UNSUPPORTED_COMPLETION, "")
    else:
        _refuse_unsupported(body, _UNSUPPORTED_CHAT, "")
        for i, message in enumerate(body.messages):
            _refuse_unsupported(message, dict.fromkeys(_UNSUPPORTED_MESSAGE, ()), f"messages[{i}].")


def _refuse_unsupported(model: BaseModel, fields: dict[str, tuple[Any, ...]], prefix: str) -> None:
    for name, accepted in fields.items():
        value = getattr(model, name)
        if value is not None and value not in accepted:
            raise invalid_request(
                f"{prefix}{name} is not supported by this server", f"{prefix}{name}", "unsupported_parameter"
            )


def num_choices(body: CompletionRequest | ChatCompletionRequest) -> int:
    n = 1 if body.n is None else body.n
    if not 1 <= n <= MAX_N:
        raise invalid_request(f"n must be in [1, {MAX_N}], got {n}", "n")
    return n


def num_logprobs(body: CompletionRequest | ChatCompletionRequest) -> int | None:
    """How many most likely tokens to return per position; None when logprobs are off."""
    if isinstance(body, CompletionRequest):
        k, param = body.logprobs, "logprobs"
    else:
        if body.top_logprobs is not None and not body.logprobs:
            raise invalid_request("top_logprobs needs logprobs set to true", "top_logprobs")
        k, param = (body.top_logprobs or 0) if body.logprobs else None, "top_logprobs"
    if k is not None and not 0 <= k <= MAX_LOGPROBS:
        raise invalid_request(f"{param} must be in [0, {MAX_LOGPROBS}], got {k}", param)
    return k


def stop_strings(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid_request(
            f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stops)}", "stop"
        )
    if any(s == "" for s in stops):
        raise invalid_request("stop strings must not be empty", "stop")
    longest = max((len(s) for s in stops), default=0)
    if longest > MAX_STOP_STRING_CHARS:
        raise invalid_request(
            f"stop strings must be at most {MAX_STOP_STRING_CHARS} characters, got {longest}", "stop"
        )
    return stops


def check_user(user: str | None, param: str = "user") -> str:
    """An end-user id (`user`, `safety_identifier`): stored with the request, so bounded."""
    user = user or ""
    if len(user) > MAX_USER_CHARS:
        raise invalid_request(f"{param} must be at most {MAX_USER_CHARS} characters", param)
    return user


def check_prompt_length(num_prompt_tokens: int, served: ServedModel, param: str) -> None:
    """The operator's cap on prompts (the context length is checked in resolve_max_tokens)."""
    cap = served.rules.max_prompt_tokens
    if cap is not None and num_prompt_tokens > cap:
        raise invalid_request(
            f"The prompt has {num_prompt_tokens} tokens; this server accepts at most {cap}. "
            "Please shorten the prompt.",
            param,
            "prompt_too_long",
        )


def _requested_max_tokens(body: CompletionRequest | ChatCompletionRequest) -> tuple[int | None, str]:
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        return body.max_completion_tokens, "max_completion_tokens"
    return body.max_tokens, "max_tokens"


def resolve_max_tokens(
    body: CompletionRequest | ChatCompletionRequest, num_prompt_tokens: int, served: ServedModel
) -> int:
    """max_tokens as asked, or all the room the context has left; 400 when prompt + output cannot fit."""
    max_tokens, param = _requested_max_tokens(body)
    # A completion may generate nothing: with echo and logprobs that scores a prompt (lm-eval).
    least = 0 if isinstance(body, CompletionRequest) else 1
    if max_tokens is not None and max_tokens < least:
        raise invalid_request(f"{param} must be at least {least}, got {max_tokens}", param)
    cap = served.rules.max_tokens
    if cap is not None and max_tokens is not None and max_tokens > cap:
        raise invalid_request(f"{param} must be at most {cap} on this server, got {max_tokens}", param)
    max_model_len = served.rules.max_model_len
    room = max_model_len - num_prompt_tokens
    prompt_param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    if room < 1:
        raise invalid_request(
            f"This model's maximum context length is {max_model_len} tokens, and the prompt has "
            f"{num_prompt_tokens} tokens, which leaves no room for output. Please shorten the prompt.",
            prompt_param,
            "context_length_exceeded",
        )
    if max_tokens is None:
        return room if cap is None else min(room, cap)
    if max_tokens > room:
        raise invalid_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, {max_tokens} in "
            f"the completion). Please reduce the length of the prompt or {param}.",
            param,
            "context_length_exceeded",
        )
    return max_tokens


def sampling_params(
    body: CompletionRequest | ChatCompletionRequest,
    max_tokens: int,
    served: ServedModel,
    tool_calls: StructuredOutput | None = None,
) -> SamplingParams:
    """`tool_calls`: the grammar that forces tool calls (tool_choice required or named), if any."""
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
    if body.seed is not None and body.seed + num_choices(body) - 1 > _INT64_MAX:
        raise invalid_request(
            "seed + n - 1 must fit in a signed 64-bit integer (choice i uses seed + i)", "seed"
        )
    stop_token_ids = list(body.stop_token_ids or [])
    if len(stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise invalid_request(f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids are allowed", "stop_token_ids")
    check_token_ids(stop_token_ids, served, "stop_token_ids")
    min_tokens = 0 if body.min_tokens is None else body.min_tokens
    if not 0 <= min_tokens <= max_tokens:
        raise invalid_request(
            f"min_tokens must be in [0, max_tokens={max_tokens}], got {min_tokens}", "min_tokens"
        )
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=body.seed,
        stop_token_ids=stop_token_ids,
        ignore_eos=bool(body.ignore_eos),
        min_p=_in_range(body.min_p, 0.0, 0.0, 1.0, "min_p"),
        presence_penalty=_in_range(body.presence_penalty, 0.0, -MAX_PENALTY, MAX_PENALTY, "presence_penalty"),
        frequency_penalty=_in_range(
            body.frequency_penalty, 0.0, -MAX_PENALTY, MAX_PENALTY, "frequency_penalty"
        ),
        repetition_penalty=_repetition_penalty(body.repetition_penalty),
        logit_bias=_logit_bias(body.logit_bias, served),
        min_tokens=min_tokens,
        logprobs=num_logprobs(body),
        # Echoed with logprobs, the prompt's tokens get theirs too (the legacy completions API).
        prompt_logprobs=num_logprobs(body) if isinstance(body, CompletionRequest) and body.echo else None,
        structured_output=structured_output(body, tool_calls),
    )


def _in_range(value: float | None, default: float, low: float, high: float, param: str) -> float:
    if value is None:
        return default
    if not low <= value <= high:  # also rejects NaN
        raise invalid_request(f"{param} must be in [{low:g}, {high:g}], got {value}", param)
    return value


def _repetition_penalty(value: float | None) -> float:
    if value is None:
        return 1.0
    if not (value > 0.0 and math.isfinite(value)):
        raise invalid_request(
            f"repetition_penalty must be a finite number > 0, got {value}", "repetition_penalty"
        )
    return value


def _logit_bias(bias: dict[str, float] | None, served: ServedModel) -> dict[int, float]:
    result: dict[int, float] = {}
    if bias and len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise invalid_request(f"logit_bias may hold at most {MAX_LOGIT_BIAS_ENTRIES} entries", "logit_bias")
    for key, value in (bias or {}).items():
        try:
            token_id = int(key)
        except ValueError:
            raise invalid_request(f"logit_bias keys must be token ids, got {key!r}", "logit_bias") from None
        check_token_ids([token_id], served, "logit_bias")
        if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise invalid_request(
                f"logit_bias values must be in [-100, 100], got {value} for token {key}", "logit_bias"
            )
        result[token_id] = value
    return result


def check_token_ids(token_ids: list[int], served: ServedModel, param: str) -> None:
    vocab_size = served.tokenizer.vocab_size
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise invalid_request(f"token id {bad} is outside the vocabulary [0, {vocab_size})", param)
