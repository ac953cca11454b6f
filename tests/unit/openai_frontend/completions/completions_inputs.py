"""What the renderers read, made by hand: a choice's tokens as the follower hands them over (token
events, `Output`s, a `Completed` choice), with logprobs a test can predict, and a stream run through
an endpoint's chunks as the gateway runs it (opening, a delta per output, the usage chunk)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from common.protocol import PromptEvent, TokenEvent
from openai_frontend.completions.endpoint import Endpoint, usage
from openai_frontend.completions.logprobs import LogprobsFormatter
from openai_frontend.follow.collect import Completed
from openai_frontend.follow.request_follower import Output
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.model.served_model import ServedModel


def logprob(index: int) -> float:
    """The sampled token's logprob at output index `index`; its runner-up has one less."""
    return -0.25 * (index + 1)


def events(req_id: str, token_ids: Sequence[int], start: int = 0, top: int = 2) -> list[TokenEvent]:
    """Token events with logprobs: the sampled token first among the `top`, then the next ids."""
    return [
        TokenEvent(
            req_id=req_id,
            index=start + i,
            token_id=token_id,
            attempt=0,
            logprob=logprob(start + i),
            top_token_ids=[token_id + k for k in range(top)],
            top_logprobs=[logprob(start + i) - k for k in range(top)],
        )
        for i, token_id in enumerate(token_ids)
    ]


def outputs(
    served: ServedModel, req_id: str, text: str, finish_reason: str, eos: bool = False, cached: int = 0
) -> list[Output]:
    """`text` one token per output, as a stream delivers it; `eos` ends it with the EOS token, which
    counts as output but has no text."""
    token_ids = served.tokenizer.encode(text, add_special_tokens=False)
    texts = [served.tokenizer.decode([t]) for t in token_ids]
    if eos:
        token_ids, texts = [*token_ids, served.tokenizer.eos_token_ids[0]], [*texts, ""]
    last = len(token_ids) - 1
    return [
        Output(
            entry_id=f"{i + 1}-0",
            text=piece,
            finish_reason=finish_reason if i == last else None,
            num_output_tokens=i + 1,
            num_cached_tokens=cached,
            token_ids=[token_id],
            events=events(req_id, [token_id], start=i),
        )
        for i, (token_id, piece) in enumerate(zip(token_ids, texts, strict=True))
    ]


def prompt_output(prompt: PromptEvent, finish_reason: str | None = None) -> Output:
    """The prompt's logprobs on an output of their own, before any text (the end, with max_tokens 0)."""
    return Output(
        entry_id="0-1",
        text="",
        finish_reason=finish_reason,
        num_output_tokens=0,
        num_cached_tokens=0,
        token_ids=[],
        events=[],
        prompt=prompt,
    )


def completed(outs: Sequence[Output]) -> Completed:
    """The choice whole, as a non-streaming answer collects it."""
    done = Completed()
    for out in outs:
        done.add(out)
    return done


def body(
    endpoint: Endpoint,
    served: ServedModel,
    requests: Sequence[PreparedRequest],
    choices: Sequence[Sequence[Output]],
) -> dict[str, Any]:
    first = requests[0]
    formatter = LogprobsFormatter(served.tokenizer.tokenizer)
    done = [completed(outs) for outs in choices]
    # Through JSON, as the client reads it.
    built = endpoint.body(requests, done, first.response_id, first.created, served.rules.name, formatter)
    return dict(json.loads(json.dumps(built)))


def stream(
    endpoint: Endpoint,
    served: ServedModel,
    requests: Sequence[PreparedRequest],
    choices: Sequence[Sequence[Output]],
) -> list[dict[str, Any]]:
    """Every chunk's JSON: the opening ones, each choice's deltas in turn, and the usage chunk when
    the request asked for it (gateway/streaming/sse_stream.py's order)."""
    first = requests[0]
    formatter = LogprobsFormatter(served.tokenizer.tokenizer)
    chunks = endpoint.chunks(first.response_id, first.created, served.rules.name, first, formatter, requests)
    sent = list(chunks.opening())
    for index, outs in enumerate(choices):
        sent += [chunk for out in outs if (chunk := chunks.delta(index, out)) is not None]
    if first.include_usage:
        counts = [outs[-1].num_output_tokens for outs in choices]
        sent.append(chunks.usage(usage(requests, counts, [outs[-1].num_cached_tokens for outs in choices])))
    return [json.loads(chunk) for chunk in sent]
