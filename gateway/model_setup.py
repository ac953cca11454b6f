"""The served models the gateway's settings name, set up at startup: each one's tokenizer loaded, its
chat template checked, and its rules made from the settings (and its entry of GATEWAY_MODELS_CONFIG),
once."""

from __future__ import annotations

from pathlib import Path

from common.models_config import ModelConfig
from gateway.settings import GatewaySettings, reasoning_parser_name, tool_parser_name
from openai_frontend.model.chat_template import check_template
from openai_frontend.model.path_names import directory_names
from openai_frontend.model.served_model import ModelRules, ServedModel
from openai_frontend.model.served_models import ServedModels
from openai_frontend.model.tokenizer import ModelTokenizer, read_max_model_len
from openai_frontend.model.vision_processor import load_vision_processor


def load_served_models(settings: GatewaySettings) -> ServedModels:
    """GATEWAY_MODELS_CONFIG's models in its order, or GATEWAY_MODEL's one."""
    config = settings.models_file
    if config is None:
        return ServedModels([load_served_model(settings)])
    return ServedModels([_configured(settings, m) for m in config.models])


def load_served_model(settings: GatewaySettings) -> ServedModel:
    """GATEWAY_MODEL's model, by the gateway's own settings."""
    assert settings.model is not None  # without a models config, GATEWAY_MODEL is set
    return _served(
        settings,
        settings.model,
        name=settings.model_name,
        max_model_len=settings.max_model_len,
        # As vLLM: a model the operator did not name answers to its path too (its default name there).
        path_names=frozenset() if settings.served_model_name else directory_names(settings.model, Path.cwd()),
    )


def _configured(settings: GatewaySettings, config: ModelConfig) -> ServedModel:
    where = f"GATEWAY_MODELS_CONFIG's model {config.name!r}"
    return _served(
        settings,
        config.model,
        name=config.name,
        max_model_len=config.max_model_len or settings.max_model_len,
        path_names=frozenset() if config.served_model_name else directory_names(config.model, Path.cwd()),
        tool_parser=tool_parser_name(config.tool_parser or settings.tool_parser, f"{where}: tool_parser"),
        reasoning_parser=reasoning_parser_name(
            config.reasoning_parser or settings.reasoning_parser, f"{where}: reasoning_parser"
        ),
        cells=tuple(config.placement_cells),
    )


def _served(
    settings: GatewaySettings,
    model_dir: Path,
    *,
    name: str,
    max_model_len: int | None,
    path_names: frozenset[str],
    tool_parser: str | None = None,
    reasoning_parser: str | None = None,
    cells: tuple[str, ...] = (),
) -> ServedModel:
    tokenizer = ModelTokenizer(model_dir)
    if tokenizer.chat_template is not None:
        check_template(tokenizer.chat_template)
    max_model_len = max_model_len or read_max_model_len(model_dir)
    if max_model_len is None:
        raise ValueError(
            f"{model_dir}/config.json declares no context length; set GATEWAY_MAX_MODEL_LEN "
            "(or the model's max_model_len in GATEWAY_MODELS_CONFIG)"
        )
    rules = ModelRules(
        name=name,
        max_model_len=max_model_len,
        max_prompt_tokens=settings.max_prompt_tokens,
        max_tokens=settings.max_tokens,
        special_tokens_in_content=settings.chat_content_special_tokens,
        tool_parser=tool_parser or settings.tool_parser,
        reasoning_parser=reasoning_parser or settings.reasoning_parser,
        path_names=path_names,
        cells=cells,
        media=settings.media_rules(),
    )
    vision = load_vision_processor(model_dir)  # None: a text model
    return ServedModel(rules=rules, root=str(model_dir), tokenizer=tokenizer, vision=vision)
