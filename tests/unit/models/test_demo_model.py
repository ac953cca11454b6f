"""The shipped demo model (`models/demo`) loads like any hub model and writes English, not token soup.

It is trained by `scripts/train_demo_model.py`; these checks hold for any faithful retraining.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cbserve import LLM, SamplingParams
from openai_frontend.model.chat_template import render_chat
from openai_frontend.model.chatml import CHAT_TEMPLATE
from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.tools.parsers import HERMES, new_parser
from scripts.demo_tool_samples import TOOLS

DEMO_DIR = Path(__file__).resolve().parents[3] / "models" / "demo"
MAX_BYTES = 20_000_000
ENGLISH_PROMPTS = ["The import statement", "A function is", "Exceptions are"]
CHAT = [{"role": "user", "content": "What is the assert statement?"}]
NEW_TOKENS = 30


@pytest.fixture(scope="module")
def model() -> Any:
    return AutoModelForCausalLM.from_pretrained(DEMO_DIR, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(DEMO_DIR)


@lru_cache(maxsize=1)
def corpus_words() -> frozenset[str]:
    """Every word of the text the model was trained on (the stdlib's bundled Python documentation)."""
    from pydoc_data.topics import topics

    return frozenset(w.lower() for text in topics.values() for w in re.findall(r"[A-Za-z]+", text))


def greedy_ids(model: Any, prompt_ids: list[int], max_new_tokens: int = NEW_TOKENS) -> list[int]:
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens
        )
    return [int(t) for t in out[0, len(prompt_ids) :]]


def chat_ids(tokenizer: Any, conversation: list[dict[str, str]]) -> list[int]:
    out = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_directory_is_a_small_hub_layout() -> None:
    names = {p.name for p in DEMO_DIR.iterdir()}
    expected = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}
    assert expected <= names
    assert names & {"tokenizer_config.json", "chat_template.jinja"}
    size = sum(p.stat().st_size for p in DEMO_DIR.rglob("*") if p.is_file())
    assert size <= MAX_BYTES, f"models/demo is {size / 1e6:.1f} MB, over {MAX_BYTES / 1e6:.0f} MB"


def test_special_tokens_and_chat_template(model: Any, tokenizer: Any) -> None:
    eos, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    assert tokenizer.eos_token == "<|endoftext|>"
    assert model.generation_config.eos_token_id == [eos, im_end]
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert (
        text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    # The template the training script writes, tool turns included (openai_frontend/model/chatml.py).
    assert (DEMO_DIR / "chat_template.jinja").read_text() == CHAT_TEMPLATE


def test_greedy_continuations_are_english(model: Any, tokenizer: Any) -> None:
    """Real words, not token soup, and no collapse into one word; a continuation may end early at EOS."""
    all_words: list[str] = []
    for prompt in ENGLISH_PROMPTS:
        text = tokenizer.decode(greedy_ids(model, tokenizer.encode(prompt)), skip_special_tokens=True)
        words = [w.lower() for w in re.findall(r"[A-Za-z]+", text)]
        assert len(words) >= 3, (prompt, text)
        assert sum(w in corpus_words() for w in words) >= 0.8 * len(words), (prompt, text)
        if len(words) >= 10:
            assert Counter(words).most_common(1)[0][1] <= len(words) // 3, (prompt, text)
            assert len(set(words)) >= len(words) // 2, (prompt, text)
        all_words += words
    assert len(all_words) >= 30, all_words


def test_chat_answer_is_english_and_ends(model: Any, tokenizer: Any) -> None:
    out = greedy_ids(model, chat_ids(tokenizer, CHAT), max_new_tokens=80)
    assert out[-1] in model.generation_config.eos_token_id, "the answer should end with <|im_end|>"
    words = re.findall(r"[A-Za-z]+", tokenizer.decode(out, skip_special_tokens=True).lower())
    assert len(words) >= 5
    assert sum(w in corpus_words() for w in words) >= 0.8 * len(words)


def test_gateway_tokenizer_matches_autotokenizer(tokenizer: Any) -> None:
    ours = ModelTokenizer(DEMO_DIR)
    prompt = ENGLISH_PROMPTS[0]
    assert ours.encode(prompt, add_special_tokens=True) == tokenizer.encode(prompt)
    assert ours.chat_template is not None
    text = render_chat(ours.chat_template, CHAT, special_tokens=ours.special_tokens)
    assert ours.encode(text, add_special_tokens=False) == chat_ids(tokenizer, CHAT)
    assert ours.eos_token_ids == tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])


def test_worker_greedy_equals_generate(model: Any, tokenizer: Any) -> None:
    """The worker's loading path (float16 checkpoint, paged attention), in the in-process engine that
    `LLM` drives, gives the same greedy tokens."""
    max_tokens = 12
    prompt = tokenizer.encode(ENGLISH_PROMPTS[1])
    llm = LLM(str(DEMO_DIR), device="cpu", num_blocks=8, block_size=16)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    (output,) = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
    assert output.outputs[0].token_ids == greedy_ids(model, prompt, max_tokens)


@pytest.mark.parametrize(
    ("question", "tool"),
    [
        ("What is the weather in Tokyo?", "get_weather"),
        ("What is 3 plus 4?", "add"),
        ("Search the docs for the assert statement.", "search_docs"),
        ("Hello", None),
    ],
)
def test_offered_tools_it_calls_the_right_one(
    model: Any, tokenizer: Any, question: str, tool: str | None
) -> None:
    """What `make run` shows of tool calling: a question a tool answers gets one call of that tool in
    the format the server parses, with arguments its schema accepts; a greeting gets no call."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    out = greedy_ids(model, tokenizer.encode(text, add_special_tokens=False), max_new_tokens=60)
    answer = tokenizer.decode(out, skip_special_tokens=True)
    parser = new_parser(HERMES, "demo", None)
    deltas = [parser.feed(answer), parser.finish()]
    calls = [c for d in deltas for c in d.tool_calls]
    if tool is None:
        assert not calls and answer.strip(), answer
        return
    assert [c.name for c in calls if c.name] == [tool], answer
    arguments = json.loads("".join(c.arguments for c in calls))
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == tool)
    jsonschema.validate(arguments, schema)
