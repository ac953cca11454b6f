"""The gateway's tokenizer (tokenizers + jinja2, no transformers) matches transformers.AutoTokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from gateway.model_setup import load_served_model
from gateway.settings import GatewaySettings
from openai_frontend.generate.prompts import chat_prompt_ids, completion_prompt_ids
from openai_frontend.model.chat_template import ChatTemplateError, render_chat
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.openai_schemas import ChatMessage

TEXTS = [
    "Hello world",
    " leading space and trailing space ",
    "Return a new dict.\n\nIt has  two   spaces and\ttabs.",
    "unicode: café 日本語 🎉",
    "<|im_start|>special tokens in plain text<|im_end|>",
]
CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What does os.path.join do?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Explain 'json.dumps' in one line, please 🙂"},
    ],
]
# Exercises what Hub templates use: namespace, loop controls, raise_exception, tojson, bos_token.
RICH_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(n=0) %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('system must come first') }}{% endif %}"
    "{% set ns.n = ns.n + 1 %}"
    "{% if m['role'] == 'assistant' %}{% generation %}[A]{{ m['content'] | trim }}{% endgeneration %}"
    "{% else %}[{{ m['role'] | upper }}]{{ m['content'] }}{% endif %}\n"
    "{% if ns.n > 10 %}{% break %}{% endif %}"
    "{% endfor %}"
    "meta={{ {'n': ns.n, 'html': '<b>&</b>', 'é': 1} | tojson }}\n"
    "{% if add_generation_prompt %}[A]{% endif %}"
)


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> ServedModel:
    return load_served_model(GatewaySettings(model=tiny_model_dir))


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _hf_chat_ids(hf: Any, conversation: list[dict[str, str]], **kwargs: Any) -> list[int]:
    out = hf.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True, **kwargs)
    # transformers 5 returns a BatchEncoding here, 4.x a plain list.
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("text", TEXTS)
def test_plain_text_ids_match(served: ServedModel, hf_tokenizer: Any, text: str) -> None:
    assert completion_prompt_ids(text, served) == hf_tokenizer.encode(text)
    assert served.tokenizer.encode(text, add_special_tokens=False) == hf_tokenizer.encode(
        text, add_special_tokens=False
    )


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_chat_template_ids_match(
    served: ServedModel, hf_tokenizer: Any, conversation: list[dict[str, str]]
) -> None:
    tokenizer = served.tokenizer
    assert tokenizer.chat_template is not None
    text = render_chat(tokenizer.chat_template, conversation, special_tokens=tokenizer.special_tokens)
    assert text == hf_tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    messages = [ChatMessage(**m) for m in conversation]
    assert chat_prompt_ids(messages, served) == _hf_chat_ids(hf_tokenizer, conversation)


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_rich_template_renders_like_transformers(
    served: ServedModel, hf_tokenizer: Any, conversation: list[dict[str, str]]
) -> None:
    ours = render_chat(RICH_TEMPLATE, conversation, special_tokens=served.tokenizer.special_tokens)
    theirs = hf_tokenizer.apply_chat_template(
        conversation, chat_template=RICH_TEMPLATE, add_generation_prompt=True, tokenize=False
    )
    assert ours == theirs
    assert '"html": "<b>&</b>"' in ours  # tojson does not HTML-escape


def test_raise_exception_becomes_template_error(served: ServedModel) -> None:
    bad = [{"role": "user", "content": "x"}, {"role": "system", "content": "late"}]
    with pytest.raises(ChatTemplateError, match="system must come first"):
        render_chat(RICH_TEMPLATE, bad, special_tokens=served.tokenizer.special_tokens)


def test_special_tokens_and_eos_ids_match(
    served: ServedModel, hf_tokenizer: Any, tiny_model_dir: Path
) -> None:
    tokenizer = served.tokenizer
    assert tokenizer.special_tokens["bos_token"] == hf_tokenizer.bos_token
    assert tokenizer.special_tokens["eos_token"] == hf_tokenizer.eos_token
    generation_config = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert tokenizer.eos_token_ids == generation_config["eos_token_id"]
    assert tokenizer.vocab_size == len(hf_tokenizer)
    assert served.rules.max_model_len == 512
    ids = hf_tokenizer.encode("<|im_start|>Hello world<|im_end|>")
    assert tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)


def test_bos_adding_tokenizer_matches(tmp_path: Path, tiny_model_dir: Path) -> None:
    """With a post-processor that prepends BOS: plain prompts get it, chat prompts only via the template."""
    model_dir = tmp_path / "bos-model"
    shutil.copytree(tiny_model_dir, model_dir)
    tokenizer_json = json.loads((model_dir / "tokenizer.json").read_text())
    tokenizer_json["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}},
    }
    (model_dir / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    (model_dir / "chat_template.jinja").write_text(
        "{{ bos_token }}" + (model_dir / "chat_template.jinja").read_text()
    )
    served = load_served_model(GatewaySettings(model=model_dir))
    hf = AutoTokenizer.from_pretrained(model_dir)
    assert completion_prompt_ids("Hello world", served) == hf.encode("Hello world")
    assert completion_prompt_ids("Hello world", served)[0] == 0
    conversation = CONVERSATIONS[0]
    ids = chat_prompt_ids([ChatMessage(**m) for m in conversation], served)
    assert ids == _hf_chat_ids(hf, conversation)
    assert ids[:2] != [0, 0]  # BOS once, from the template
