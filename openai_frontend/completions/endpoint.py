"""What the two generation endpoints share in the shape of their answers.

Every chunk and body carries the response id, creation time, model and choices, drops the fields the
request did not ask for, and counts usage the same way; `chat.py` and `completion.py` say only how
their chunks and choices look.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel

from openai_frontend.completions.logprobs import LogprobsFormatter
from openai_frontend.completions.schemas import PromptTokensDetails, UsageInfo, response_exclude
from openai_frontend.follow.collect import Completed
from openai_frontend.follow.request_follower import Output
from openai_frontend.generate.request import Kind, PreparedRequest


def usage(
    requests: Sequence[PreparedRequest], num_output_tokens: Sequence[int], num_cached_tokens: Sequence[int]
) -> UsageInfo:
    """Each prompt is counted once, however many choices share it (as OpenAI counts n > 1), and so
    are its cached tokens: as the choice that computed the most of it found them. `requests` are
    the choices, n per prompt in order."""
    n = requests[0].n
    num_prompt_tokens = num_cached = 0
    for first in range(0, len(requests), n):
        num_prompt_tokens += requests[first].num_prompt_tokens
        num_cached += min(num_cached_tokens[first : first + n], default=0)
    completion_tokens = sum(num_output_tokens)
    return UsageInfo(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=num_prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=num_cached),
    )


@dataclass
class Chunks(ABC):
    """One response's streamed chunks: what every chunk carries; subclasses make the choices."""

    chunk_type: ClassVar[type[BaseModel]]
    response_id: str
    created: int
    model: str
    request: PreparedRequest  # the first choice: what every choice shares
    logprobs: LogprobsFormatter
    requests: Sequence[PreparedRequest] = ()  # every choice (several prompts); default n of `request`

    @property
    def choices(self) -> Sequence[PreparedRequest]:
        return self.requests or [self.request] * self.request.n

    def __post_init__(self) -> None:
        self._exclude = response_exclude(
            return_token_ids=self.request.return_token_ids, include_usage=self.request.include_usage
        )

    def _chunk(self, choices: Sequence[BaseModel], usage: UsageInfo | None = None) -> str:
        chunk = self.chunk_type(
            id=self.response_id, created=self.created, model=self.model, choices=choices, usage=usage
        )
        return chunk.model_dump_json(exclude=self._exclude)

    def _delta_chunk(self, choice_type: type[BaseModel], index: int, out: Output, **fields: Any) -> str:
        """The chunk of one choice's step: `fields` say what it adds, `out` how it ends and its ids."""
        fields.setdefault("finish_reason", out.finish_reason)  # the endpoint may name it (tool_calls)
        choice = choice_type(index=index, token_ids=out.token_ids, **fields)
        return self._chunk([choice], self.usage_so_far(index, out.num_output_tokens, out.num_cached_tokens))

    def usage_so_far(
        self, index: int, num_output_tokens: int = 0, num_cached_tokens: int = 0
    ) -> UsageInfo | None:
        """With continuous_usage_stats (vLLM's), each chunk's usage: its choice's prompt and the tokens
        generated so far; else None (the usage comes once, at the end)."""
        if not self.request.continuous_usage:
            return None
        request = self.choices[index]
        return usage([request], [num_output_tokens], [num_cached_tokens])

    @abstractmethod
    def opening(self) -> list[str]: ...

    @abstractmethod
    def delta(self, index: int, out: Output) -> str | None: ...  # None: nothing to send

    def usage(self, usage: UsageInfo) -> str:
        return self._chunk([], usage)


# (choice index, the choice whole, the request, logprobs formatter) -> the endpoint's choice object
MakeChoice = Callable[[int, Completed, PreparedRequest, LogprobsFormatter], BaseModel]


@dataclass(slots=True, frozen=True)
class Endpoint:
    """One generation endpoint's answer shapes: its streamed chunks and its whole body."""

    kind: Kind
    chunks: type[Chunks]
    response_type: type[BaseModel]
    choice: MakeChoice

    def body(
        self,
        requests: Sequence[PreparedRequest],
        done: list[Completed],
        response_id: str,
        created: int,
        model: str,
        formatter: LogprobsFormatter,
    ) -> dict[str, Any]:
        """The non-streaming body (also what a fetch by id and a batch line return)."""
        request = requests[0]
        extra: dict[str, Any] = {}
        if self.kind == "chat" and request.prompt_logprobs:  # chat's one prompt: on the response (vLLM)
            extra["prompt_logprobs"] = formatter.prompt_logprobs(done[0].prompt)
        response = self.response_type(
            id=response_id,
            created=created,
            model=model,
            choices=[self.choice(i, c, requests[i], formatter) for i, c in enumerate(done)],
            usage=usage(requests, [c.num_output_tokens for c in done], [c.num_cached_tokens for c in done]),
            **extra,
        )
        return response.model_dump(exclude=response_exclude(return_token_ids=request.return_token_ids))
