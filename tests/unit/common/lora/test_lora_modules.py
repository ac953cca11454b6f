"""vLLM's --lora-modules, as flags and as GATEWAY_LORA_MODULES (common/lora/lora_modules.py)."""

from __future__ import annotations

import json

import pytest

from common.lora.lora_modules import LoRAModulePath, parse_lora_modules, split_lora_modules


def test_both_of_vllms_forms_in_one_setting() -> None:
    vllm_json = {"name": "chat", "path": "/a/chat", "base_model_name": "llama"}
    text = f"sql=/a/sql, {json.dumps(vllm_json)}  math=/a/math"
    assert parse_lora_modules(split_lora_modules(text)) == [
        LoRAModulePath("sql", "/a/sql"),
        LoRAModulePath("chat", "/a/chat", "llama"),
        LoRAModulePath("math", "/a/math"),
    ]
    # A JSON list: the form an environment that passes one string per flag writes (cbserve up).
    listed = json.dumps(["sql=/a/sql", vllm_json])
    assert [m.name for m in parse_lora_modules(split_lora_modules(listed))] == ["sql", "chat"]
    assert parse_lora_modules(split_lora_modules("")) == []


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["sql"], "must be name=path"),
        (["=/a/sql"], "must be name=path"),
        (['{"name": "x"}'], 'must hold "name" and "path"'),
        (["{broken"], "is not valid JSON"),
        (["a=/x", "a=/y"], "listed twice"),
    ],
)
def test_an_item_that_names_no_adapter_is_refused(items: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_lora_modules(items)
