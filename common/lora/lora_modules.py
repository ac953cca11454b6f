"""vLLM's `--lora-modules`: the LoRA adapters a deployment serves from the start.

Each item is `name=path`, or vLLM's JSON form `{"name": ..., "path": ..., "base_model_name": ...}`
(the base model's served name; without it, the only or first model). As one setting
(GATEWAY_LORA_MODULES) items are separated by spaces or commas, or the whole is a JSON list.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoRAModulePath:
    name: str  # the name clients pass as `model`
    path: str  # the adapter's directory, as the gateway and every worker of its base model see it
    base_model_name: str | None = None  # the served base model it runs on; None: the first one


def parse_lora_modules(items: Sequence[str]) -> list[LoRAModulePath]:
    """Every item, in order; ValueError naming one that is neither `name=path` nor vLLM's JSON."""
    modules = [_module(item.strip()) for item in items if item.strip()]
    names = [m.name for m in modules]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"LoRA module {twice[0]!r} is listed twice")
    return modules


def split_lora_modules(text: str) -> list[str]:
    """GATEWAY_LORA_MODULES as items: a JSON list, or items separated by spaces or commas (a JSON
    object is one item whatever it holds)."""
    text = text.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"LoRA modules are not a valid JSON list: {exc}") from None
        return [item if isinstance(item, str) else json.dumps(item) for item in items]
    return [m[0] for m in re.finditer(r"\{[^{}]*\}|[^\s,{}]+", text)]


def _module(item: str) -> LoRAModulePath:
    if item.startswith("{"):
        try:
            data = json.loads(item)
        except json.JSONDecodeError as exc:
            raise ValueError(f"LoRA module {item!r} is not valid JSON: {exc}") from None
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("name"), str)
            or not isinstance(data.get("path"), str)
        ):
            raise ValueError(f'LoRA module {item!r} must hold "name" and "path" strings')
        base = data.get("base_model_name")
        return LoRAModulePath(data["name"], data["path"], base if isinstance(base, str) else None)
    name, sep, path = item.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"LoRA module {item!r} must be name=path (or vLLM's JSON form)")
    return LoRAModulePath(name, path)
