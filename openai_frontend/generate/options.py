"""Checks of the vLLM and OpenAI request options that change how a prompt is built or a request is
kept: priority, prompt truncation, prompt logprobs, metadata, the chat template's extra variables.

Each failure is a 400 naming the parameter; the options that shape the text are applied where the
text is made (prompts.py, text/), these only say what a valid value is.
"""

from __future__ import annotations

from typing import Any

from openai_frontend.protocol.errors import invalid_request
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest, CompletionRequest

# Our priority levels (GenerateRequest.priority, lower runs first): interactive and the Batch API's.
INTERACTIVE_PRIORITY, BATCH_PRIORITY = 0, 1
MAX_PROMPT_LOGPROBS = 20  # as many as logprobs allows
# OpenAI's limits on `metadata`.
MAX_METADATA_PAIRS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512
# Variables the server itself hands to the template; chat_template_kwargs may not replace them.
_TEMPLATE_OWN = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token", "unk_token"}
    | {"pad_token", "reasoning_effort", "verbosity"}
)


def priority_level(body: CompletionRequest | ChatCompletionRequest) -> int:
    """vLLM's `priority` (lower first) as one of our levels: 0 (or none) interactive, positive the
    Batch API's level. An API key cannot go ahead of everyone's interactive requests."""
    if body.priority is None or body.priority == 0:
        return INTERACTIVE_PRIORITY
    if body.priority < 0:
        raise invalid_request(
            f"priority {body.priority} would run ahead of every interactive request, which API keys "
            "cannot ask for; use 0 (interactive, the default) or a positive value (the Batch API's level)",
            "priority",
        )
    return BATCH_PRIORITY


def truncated(
    token_ids: list[int], body: CompletionRequest | ChatCompletionRequest, max_len: int
) -> list[int]:
    """The prompt's last `truncate_prompt_tokens` tokens (vLLM's meaning; -1: the model's context)."""
    keep = body.truncate_prompt_tokens
    if keep is None:
        return token_ids
    if keep == -1:
        keep = max_len
    if keep < 1:
        raise invalid_request(
            f"truncate_prompt_tokens must be -1 (the context length) or at least 1, got {keep}",
            "truncate_prompt_tokens",
        )
    return token_ids[-keep:]


def num_prompt_logprobs(body: CompletionRequest | ChatCompletionRequest) -> int | None:
    """How many most likely tokens to give with each prompt token's logprob; None when not asked."""
    k = body.prompt_logprobs
    if k is None:
        return None
    if not 0 <= k <= MAX_PROMPT_LOGPROBS:
        raise invalid_request(
            f"prompt_logprobs must be in [0, {MAX_PROMPT_LOGPROBS}], got {k}", "prompt_logprobs"
        )
    if body.stream:
        # As vLLM: the prompt's logprobs belong to the whole answer, which a stream never sends.
        raise invalid_request(
            "prompt_logprobs is not available with stream: true; send the request without streaming",
            "prompt_logprobs",
        )
    return k


def checked_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    """OpenAI's metadata: up to 16 pairs, keys up to 64 characters, values up to 512."""
    metadata = metadata or {}
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid_request(f"metadata may hold at most {MAX_METADATA_PAIRS} pairs", "metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise invalid_request(
                f"metadata keys must be at most {MAX_METADATA_KEY_CHARS} characters", "metadata"
            )
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise invalid_request(
                f"metadata values must be at most {MAX_METADATA_VALUE_CHARS} characters", "metadata"
            )
    return metadata


def template_variables(body: ChatCompletionRequest, template_reads: frozenset[str]) -> dict[str, Any]:
    """The extra variables the chat template gets: `chat_template_kwargs`, and `reasoning_effort` /
    `verbosity`, which are refused when the template does not read them (they would change nothing)."""
    variables = dict(body.chat_template_kwargs or {})
    own = sorted(_TEMPLATE_OWN & variables.keys())
    if own:
        raise invalid_request(
            f"chat_template_kwargs cannot set {own[0]!r}: the server sets it (use the request field of "
            "that name where there is one)",
            "chat_template_kwargs",
        )
    for name in ("reasoning_effort", "verbosity"):
        value = getattr(body, name)
        if value is None:
            continue
        if name not in template_reads:
            raise invalid_request(
                f"{name} is not supported by this model: its chat template does not read it; leave it "
                "out (or pass what the template does read in chat_template_kwargs)",
                name,
                "unsupported_parameter",
            )
        variables[name] = value
    return variables
