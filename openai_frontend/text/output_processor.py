"""Turns a request's accepted token events into text deltas and a finish reason (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.text.detokenizer import IncrementalDetokenizer
from openai_frontend.text.stop_strings import StopStringMatcher


@dataclass(slots=True, frozen=True)
class OutputDelta:
    text: str  # new text safe to show the client (may be "")
    finish_reason: str | None  # "stop" or "length" on the last delta
    stop_string_hit: bool  # the gateway ended the request: the batcher must be told to stop it


class OutputProcessor:
    def __init__(
        self,
        tokenizer: ModelTokenizer,
        prompt_token_ids: list[int],
        stop: list[str],
        *,
        skip_special_tokens: bool = True,
        include_stop: bool = False,
    ) -> None:
        """`include_stop` (vLLM's include_stop_str_in_output): the stop string, or the EOS / stop token
        that ended the output, stays in the text."""
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens)
        self._matcher = StopStringMatcher(stop, include_stop)
        self._include_stop = include_stop
        self.num_output_tokens = 0

    @property
    def text(self) -> str:
        """All output text so far (cut before a stop string)."""
        return self._matcher.text

    def process(self, token_id: int, finish_reason: str | None) -> OutputDelta:
        """One new token; `finish_reason` is the worker's ("stop" for EOS / stop_token_ids, "length")."""
        self.num_output_tokens += 1
        # As in vLLM, the token that stopped generation (EOS or a stop token id) is counted but not shown,
        # unless the client asked for it (it is text only with skip_special_tokens false, or a plain token).
        if finish_reason != "stop" or self._include_stop:
            self._matcher.append(self._detokenizer.step(token_id))
        stop_string_hit = self._matcher.stopped
        finish = "stop" if stop_string_hit else finish_reason
        if finish is not None:
            self._matcher.append(self._detokenizer.flush())  # nothing after a stop string is kept
        text = self._matcher.take(final=finish is not None)
        # When the worker ended it anyway, there is nothing left to stop.
        return OutputDelta(text, finish, stop_string_hit and finish_reason is None)
