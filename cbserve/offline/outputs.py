"""What `LLM.generate` and `LLM.chat` return, in vLLM's shape and under vLLM's names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Logprob:
    logprob: float  # under the model's raw distribution
    rank: int | None = None  # 1 for the most likely token; None: the sampled token, outside the top k
    decoded_token: str | None = None  # the token's own text, special tokens included


# Per generated token: its id and the k most likely ones, each with its Logprob.
SampleLogprobs = list[dict[int, Logprob]]
# Per prompt token, as SampleLogprobs; None for the first (nothing precedes it).
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass(slots=True)
class CompletionOutput:
    index: int  # of the output in its request (always 0: one output per request)
    text: str  # the generated tokens as text, cut before a stop string
    token_ids: list[int]  # every generated token, the one that ended the output included
    cumulative_logprob: float | None  # sum of the tokens' logprobs; None unless logprobs were asked
    logprobs: SampleLogprobs | None  # None unless SamplingParams.logprobs was set
    finish_reason: str | None = None  # "stop" (EOS, a stop token id or a stop string) or "length"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it; None for EOS

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None  # the prompt's text: as given, or a chat's rendered template; None for token ids
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None  # None unless SamplingParams.prompt_logprobs was set
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
