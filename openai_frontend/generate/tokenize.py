"""vLLM's tokenizer endpoints: a prompt or a conversation to the token ids a generation request with
the same fields would queue, token ids back to text, and what a remote tokenizer client needs to know.

A conversation is rendered by the same code as `/v1/chat/completions` (template controls, tools,
special-token strings in messages as text), so `/tokenize` counts exactly what a request would send.
"""

from __future__ import annotations

from typing import Any

from openai_frontend.generate.prompts import completion_prompt_ids
from openai_frontend.generate.request_builder import prompt_ids_of
from openai_frontend.generate.validation import check_token_ids
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest
from openai_frontend.protocol.tokenizer_schemas import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)


def tokenize(body: TokenizeCompletionRequest | TokenizeChatRequest, served: ServedModel) -> TokenizeResponse:
    """`served`: the base model `body.model` names (or the one of the adapter it names)."""
    if isinstance(body, TokenizeChatRequest):
        # Every field but return_token_strs is the chat endpoint's own, with its meaning.
        chat = ChatCompletionRequest.model_validate(body.model_dump(exclude={"return_token_strs"}))
        token_ids = prompt_ids_of(chat, served)
    else:
        token_ids = completion_prompt_ids(body.prompt, served, body.add_special_tokens is not False)
    tokenizer = served.tokenizer.tokenizer
    token_strs = [str(tokenizer.id_to_token(t)) for t in token_ids] if body.return_token_strs else None
    return TokenizeResponse(
        count=len(token_ids),
        max_model_len=served.rules.max_model_len,
        tokens=token_ids,
        token_strs=token_strs,
    )


def detokenize(body: DetokenizeRequest, served: ServedModel) -> DetokenizeResponse:
    """The text of the ids, special tokens included (as vLLM's /detokenize decodes them), by the
    tokenizer of the base model `body.model` names."""
    check_token_ids(body.tokens, served, "tokens")
    return DetokenizeResponse(prompt=served.tokenizer.decode(body.tokens, skip_special_tokens=False))


def tokenizer_info(served: ServedModel) -> dict[str, Any]:
    """What lm-eval's remote tokenizer reads (special tokens, the chat template) and the context
    length, under the tokenizer_config.json names vLLM's /tokenizer_info answers with."""
    tokenizer = served.tokenizer
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": served.rules.max_model_len,
        "vocab_size": tokenizer.vocab_size,
        "chat_template": tokenizer.chat_template,
        **{
            name: tokenizer.special_tokens.get(name)
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        },
    }
