"""The answers of /v1/completions: echoed prompts, text deltas, optional usage; or one body."""

from __future__ import annotations

from openai_frontend.completions.endpoint import Chunks, Endpoint
from openai_frontend.completions.logprobs import LogprobsFormatter, joined
from openai_frontend.completions.schemas import CompletionChoice, CompletionLogprobs, CompletionResponse
from openai_frontend.follow.collect import Completed
from openai_frontend.follow.request_follower import Output
from openai_frontend.generate.request import PreparedRequest


class CompletionChunks(Chunks):
    chunk_type = CompletionResponse

    def __post_init__(self) -> None:
        super().__post_init__()
        # Where each choice's next token starts in its text, for logprobs' text_offset.
        self._offsets = [len(r.echo_text or "") for r in self.choices]

    def opening(self) -> list[str]:
        # An echo with logprobs waits for the prompt's logprobs, and goes out with them.
        return [
            self._chunk([CompletionChoice(index=i, text=r.echo_text)], self.usage_so_far(i))
            for i, r in enumerate(self.choices)
            if r.echo_text and not r.echo_logprobs
        ]

    def delta(self, index: int, out: Output) -> str:
        request = self.choices[index]
        text, logprobs = out.text, None
        if request.logprobs:
            logprobs, self._offsets[index] = self.logprobs.completion(out.events, self._offsets[index])
        if out.prompt is not None and request.echo_logprobs:
            text = (request.echo_text or "") + text
            logprobs = joined(
                self.logprobs.prompt_completion(out.prompt)[0], logprobs or CompletionLogprobs()
            )
        return self._delta_chunk(CompletionChoice, index, out, text=text, logprobs=logprobs)


def _choice(
    index: int, done: Completed, request: PreparedRequest, formatter: LogprobsFormatter
) -> CompletionChoice:
    echo = request.echo_text or ""
    logprobs = None
    if request.logprobs:
        logprobs = formatter.completion(done.events, len(echo))[0]
        if request.echo_logprobs and done.prompt is not None:
            logprobs = joined(formatter.prompt_completion(done.prompt)[0], logprobs)
    return CompletionChoice(
        index=index,
        text=echo + done.text,
        logprobs=logprobs,
        finish_reason=done.finish_reason,
        token_ids=done.token_ids,
        prompt_logprobs=formatter.prompt_logprobs(done.prompt) if request.prompt_logprobs else None,
    )


COMPLETION = Endpoint("completion", CompletionChunks, CompletionResponse, _choice)
