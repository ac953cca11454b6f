"""`usage.completion_tokens_details.reasoning_tokens`: the tokens of a choice's thoughts, from the one
that opens them (or the first, when the prompt opened them) to the one that closes them, as vLLM
counts them (harmony: the tokens of `analysis` messages). Tokens are read one at a time with their own
text (special tokens too): the markers are whole tokens or ASCII, which one token's text always holds."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from openai_frontend.reasoning import THINK
from openai_frontend.reasoning.parser import new_reasoning_parser


class ReasoningCounter:
    def __init__(self, open_in_prompt: bool, token_text: Callable[[int], str], parser: str = THINK) -> None:
        self._parser = new_reasoning_parser(parser, open_in_prompt)
        self._token_text = token_text
        self.num_tokens = 0

    def add(self, token_ids: Sequence[int]) -> None:
        for token_id in token_ids:
            if not self._parser.thinking:
                return
            before = self._parser.in_thoughts
            self._parser.feed(self._token_text(token_id))
            if before or self._parser.in_thoughts:
                self.num_tokens += 1


def num_reasoning_tokens(
    reasoning_parser: str | None,
    open_in_prompt: bool,
    token_ids: Sequence[int],
    token_text: Callable[[int], str],
) -> int:
    """The thoughts' tokens among a whole choice's `token_ids` (0 for a model that does not think)."""
    if reasoning_parser is None:
        return 0
    counter = ReasoningCounter(open_in_prompt, token_text, reasoning_parser)
    counter.add(token_ids)
    return counter.num_tokens
