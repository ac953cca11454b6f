"""Token events with logprobs -> the OpenAI chat and completions logprobs shapes.

Each token is shown as its own decoded text (special tokens included, as vLLM does), with `bytes`
its UTF-8 encoding; a token that is part of a multi-byte character decodes to U+FFFD, as in vLLM.
Every generated token gets an entry, including the EOS / stop token that ends the output (it counts
in `usage` and in `token_ids` but is not in the text). An echoed prompt's tokens come first in the
completions shape, the first of them with a null logprob (nothing precedes it), as vLLM returns them.
"""

from __future__ import annotations

from tokenizers import Tokenizer

from common.protocol import PromptEvent, TokenEvent
from openai_frontend.completions.schemas import (
    ChatLogprobs,
    CompletionLogprobs,
    PromptLogprob,
    PromptLogprobs,
    TokenLogprob,
    TopLogprob,
)


class LogprobsFormatter:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._text: dict[int, str] = {}  # token id -> its text, decoded once per request

    def token_text(self, token_id: int) -> str:
        text = self._text.get(token_id)
        if text is None:
            text = self._text[token_id] = str(self._tokenizer.decode([token_id], skip_special_tokens=False))
        return text

    def _top(self, token_id: int, logprob: float) -> TopLogprob:
        text = self.token_text(token_id)
        return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))

    def chat(self, events: list[TokenEvent]) -> ChatLogprobs:
        content = []
        for event in events:
            sampled = self._top(event.token_id, _logprob(event))
            top = [self._top(t, lp) for t, lp in zip(event.top_token_ids, event.top_logprobs, strict=True)]
            content.append(TokenLogprob(**sampled.model_dump(), top_logprobs=top))
        return ChatLogprobs(content=content)

    def completion(self, events: list[TokenEvent], text_offset: int) -> tuple[CompletionLogprobs, int]:
        """The entries of `events`, the first at `text_offset`; also returns the offset after them."""
        result = CompletionLogprobs()
        for event in events:
            text = self.token_text(event.token_id)
            result.tokens.append(text)
            result.token_logprobs.append(_logprob(event))
            top = {
                self.token_text(t): lp for t, lp in zip(event.top_token_ids, event.top_logprobs, strict=True)
            }
            result.top_logprobs.append(top)
            result.text_offset.append(text_offset)
            text_offset += len(text)
        return result, text_offset

    def prompt_completion(self, prompt: PromptEvent) -> tuple[CompletionLogprobs, int]:
        """The echoed prompt's entries, the first at offset 0; also returns the offset after them."""
        result = CompletionLogprobs()
        text_offset = 0
        for i, token_id in enumerate(prompt.token_ids):
            text = self.token_text(token_id)
            result.tokens.append(text)
            result.text_offset.append(text_offset)
            text_offset += len(text)
            if i == 0:  # nothing precedes the first token: no logprob (null, as in vLLM)
                result.token_logprobs.append(None)
                result.top_logprobs.append(None)
                continue
            result.token_logprobs.append(prompt.logprobs[i - 1])
            ids, values = prompt.top_token_ids[i - 1], prompt.top_logprobs[i - 1]
            result.top_logprobs.append({self.token_text(t): lp for t, lp in zip(ids, values, strict=True)})
        return result, text_offset

    def prompt_logprobs(self, prompt: PromptEvent | None) -> PromptLogprobs:
        """vLLM's `prompt_logprobs`: per prompt token, null for the first (nothing precedes it), else
        token id -> logprob, rank (1 is the most likely; null when the prompt's own token is not
        among the top ones) and decoded text, for the prompt's token and the most likely ones."""
        if prompt is None:
            return []
        result: PromptLogprobs = [None]
        for i, token_id in enumerate(prompt.token_ids[1:]):
            ids, values = prompt.top_token_ids[i], prompt.top_logprobs[i]
            entry = {
                str(token_id): PromptLogprob(
                    logprob=prompt.logprobs[i],
                    rank=ids.index(token_id) + 1 if token_id in ids else None,
                    decoded_token=self.token_text(token_id),
                )
            }
            for rank, (t, lp) in enumerate(zip(ids, values, strict=True), start=1):
                entry.setdefault(
                    str(t), PromptLogprob(logprob=lp, rank=rank, decoded_token=self.token_text(t))
                )
            result.append(entry)
        return result


def joined(first: CompletionLogprobs, then: CompletionLogprobs) -> CompletionLogprobs:
    """Two runs of entries as one (the echoed prompt's, then the generated tokens')."""
    return CompletionLogprobs(
        tokens=first.tokens + then.tokens,
        token_logprobs=first.token_logprobs + then.token_logprobs,
        top_logprobs=first.top_logprobs + then.top_logprobs,
        text_offset=first.text_offset + then.text_offset,
    )


def _logprob(event: TokenEvent) -> float:
    # A worker always sets it for a request that asked; -inf would say "impossible", so never guess.
    if event.logprob is None:
        raise ValueError(f"token event {event.index} of {event.req_id} carries no logprob")
    return event.logprob
