"""The answers of /v1/completions: echoed prompts, text deltas, optional usage; or one body."""

from __future__ import annotations

from openai_frontend.collect import Completed
from openai_frontend.logprobs import LogprobsFormatter
from openai_frontend.openai_schemas import CompletionChoice, CompletionResponse
from openai_frontend.request_builder import PreparedRequest
from openai_frontend.request_runner import Output
from openai_frontend.response_format import Chunks, Endpoint


class CompletionChunks(Chunks):
    chunk_type = CompletionResponse

    def __post_init__(self) -> None:
        super().__post_init__()
        # Where each choice's next token starts in its text, for logprobs' text_offset.
        self._offsets = [len(self.request.echo_text or "")] * self.request.n

    def opening(self) -> list[str]:
        echo = self.request.echo_text
        if not echo:
            return []
        return [self._chunk([CompletionChoice(index=i, text=echo)]) for i in range(self.request.n)]

    def delta(self, index: int, out: Output) -> str:
        logprobs = None
        if self.request.logprobs:
            logprobs, self._offsets[index] = self.logprobs.completion(out.events, self._offsets[index])
        choice = CompletionChoice(
            index=index,
            text=out.text,
            logprobs=logprobs,
            finish_reason=out.finish_reason,
            token_ids=out.token_ids,
        )
        return self._chunk([choice])


def _choice(
    index: int, done: Completed, request: PreparedRequest, formatter: LogprobsFormatter
) -> CompletionChoice:
    echo = request.echo_text or ""
    return CompletionChoice(
        index=index,
        text=echo + done.text,
        logprobs=formatter.completion(done.events, len(echo))[0] if request.logprobs else None,
        finish_reason=done.finish_reason,
        token_ids=done.token_ids,
    )


COMPLETION = Endpoint("completion", CompletionChunks, CompletionResponse, _choice)
