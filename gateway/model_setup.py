"""The served model the gateway's settings name, set up at startup: its tokenizer loaded, its chat
template checked, and its rules made from the settings, once."""

from __future__ import annotations

from pathlib import Path

from gateway.settings import GatewaySettings
from openai_frontend.model.chat_template import check_template
from openai_frontend.model.path_names import directory_names
from openai_frontend.model.served_model import ModelRules, ServedModel
from openai_frontend.model.tokenizer import ModelTokenizer, read_max_model_len


def load_served_model(settings: GatewaySettings) -> ServedModel:
    tokenizer = ModelTokenizer(settings.model)
    if tokenizer.chat_template is not None:
        check_template(tokenizer.chat_template)
    max_model_len = settings.max_model_len or read_max_model_len(settings.model)
    if max_model_len is None:
        raise ValueError(
            f"{settings.model}/config.json declares no context length; set GATEWAY_MAX_MODEL_LEN"
        )
    rules = ModelRules(
        name=settings.model_name,
        max_model_len=max_model_len,
        max_prompt_tokens=settings.max_prompt_tokens,
        max_tokens=settings.max_tokens,
        special_tokens_in_content=settings.chat_content_special_tokens,
        tool_parser=settings.tool_parser,
        reasoning_parser=settings.reasoning_parser,
        # As vLLM: a model the operator did not name answers to its path too (its default name there).
        path_names=frozenset() if settings.served_model_name else directory_names(settings.model, Path.cwd()),
    )
    return ServedModel(rules=rules, root=str(settings.model), tokenizer=tokenizer)
