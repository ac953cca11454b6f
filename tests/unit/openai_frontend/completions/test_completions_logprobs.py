"""Token events with logprobs as the OpenAI shapes (completions/logprobs.py): each token shown as its own
text (special tokens included) with its UTF-8 bytes, a piece of a multi-byte character as U+FFFD (as
vLLM shows it), offsets that run on across deltas, and vLLM's ranks for prompt tokens."""

from __future__ import annotations

import pytest
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.completion_choice import Logprobs

from common.protocol import PromptEvent, TokenEvent
from openai_frontend.completions.logprobs import LogprobsFormatter, joined
from openai_frontend.completions.schemas import CompletionLogprobs
from openai_frontend.model.served_model import ServedModel
from tests.unit.openai_frontend.completions.completions_inputs import events, logprob


@pytest.fixture
def formatter(tiny_served: ServedModel) -> LogprobsFormatter:
    return LogprobsFormatter(tiny_served.tokenizer.tokenizer)


def test_a_split_character_shows_as_replacement_characters(
    tiny_served: ServedModel, formatter: LogprobsFormatter
) -> None:
    token_ids = tiny_served.tokenizer.encode("é", add_special_tokens=False)
    assert len(token_ids) == 2  # the tiny model's tokenizer has no token for it: a byte each
    shown = formatter.chat(events("r", token_ids))
    ChoiceLogprobs.model_validate(shown.model_dump())
    assert [(e.token, e.bytes) for e in shown.content or []] == [("\ufffd", [0xEF, 0xBF, 0xBD])] * 2


def test_special_tokens_are_shown_by_name(tiny_served: ServedModel, formatter: LogprobsFormatter) -> None:
    eos = tiny_served.tokenizer.eos_token_ids[0]
    [entry] = formatter.chat(events("r", [eos])).content or []
    assert entry.token == "<|endoftext|>" and entry.bytes == list(b"<|endoftext|>")


def test_completion_offsets_run_on_from_one_delta_to_the_next(
    tiny_served: ServedModel, formatter: LogprobsFormatter
) -> None:
    token_ids = tiny_served.tokenizer.encode("Once upon a time", add_special_tokens=False)
    texts = [formatter.token_text(t) for t in token_ids]
    first, offset = formatter.completion(events("r", token_ids[:2]), 5)
    second, end = formatter.completion(events("r", token_ids[2:], start=2), offset)
    both = joined(first, second)
    Logprobs.model_validate(both.model_dump())
    assert both.tokens == texts and end == 5 + len("Once upon a time")
    assert both.text_offset == [5 + sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    assert both.token_logprobs == [logprob(i) for i in range(len(texts))]


def test_an_event_without_its_logprob_is_an_error_not_a_guess(formatter: LogprobsFormatter) -> None:
    event = TokenEvent(req_id="r", index=3, token_id=5, attempt=0)
    with pytest.raises(ValueError, match="token event 3 of r carries no logprob"):
        formatter.chat([event])
    with pytest.raises(ValueError):
        formatter.completion([event], 0)


def test_prompt_ranks_are_null_for_a_token_outside_the_top_ones(
    tiny_served: ServedModel, formatter: LogprobsFormatter
) -> None:
    prompt = PromptEvent(
        req_id="r",
        attempt=0,
        token_ids=[10, 11, 12],
        logprobs=[-3.0, -0.1],
        top_token_ids=[[20, 21], [12, 20]],
        top_logprobs=[[-0.2, -0.9], [-0.1, -2.5]],
    )
    first, second, third = formatter.prompt_logprobs(prompt)
    assert first is None
    text = formatter.token_text
    assert second is not None and third is not None
    assert {k: (v.logprob, v.rank, v.decoded_token) for k, v in second.items()} == {
        "11": (-3.0, None, text(11)),  # the prompt's own token comes first, unranked
        "20": (-0.2, 1, text(20)),
        "21": (-0.9, 2, text(21)),
    }
    assert {k: (v.logprob, v.rank) for k, v in third.items()} == {"12": (-0.1, 1), "20": (-2.5, 2)}
    assert formatter.prompt_logprobs(None) == []


def test_joined_puts_the_prompts_entries_first() -> None:
    prompt = CompletionLogprobs(tokens=["a"], token_logprobs=[None], top_logprobs=[None], text_offset=[0])
    output = CompletionLogprobs(
        tokens=["b"], token_logprobs=[-1.0], top_logprobs=[{"b": -1.0}], text_offset=[1]
    )
    assert joined(prompt, output) == CompletionLogprobs(
        tokens=["a", "b"], token_logprobs=[None, -1.0], top_logprobs=[None, {"b": -1.0}], text_offset=[0, 1]
    )
