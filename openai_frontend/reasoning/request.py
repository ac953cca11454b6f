"""What a chat request's record says of the model's thoughts: the reasoning format to read them by,
and whether the prompt already opened them."""

from __future__ import annotations

from typing import TypedDict

from openai_frontend.model.served_model import ServedModel
from openai_frontend.reasoning import HARMONY, chosen, prompt_state

# Enough prompt tokens to hold `<think>\n\n</think>\n\n` however a tokenizer cuts it.
_TAIL_TOKENS = 16


class Thinking(TypedDict):
    reasoning_parser: str | None
    reasoning_open: bool


def thinking(served: ServedModel, is_chat: bool, prompt_token_ids: list[int]) -> Thinking:
    parser = chosen(served.rules.reasoning_parser, served.tokenizer.chat_template) if is_chat else None
    if parser is None:
        return Thinking(reasoning_parser=None, reasoning_open=False)
    state = prompt_state(served.tokenizer.decode(prompt_token_ids[-_TAIL_TOKENS:]))
    # Thoughts the template closed (thinking turned off) leave nothing to split.
    return Thinking(reasoning_parser=None if state == "closed" else parser, reasoning_open=state == "open")


def harmony_markers(tool_parser: str | None, think: Thinking) -> bool:
    """Whether the answer is read by harmony's parsers, which need its markers (gpt-oss's special
    tokens) in the text."""
    return HARMONY in (tool_parser, think["reasoning_parser"])
