"""The n-gram proposer and who drafts: unit tests without a model."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from batcher.core.request import Request
from batcher.core.spec_decode.drafting import propose_drafts
from batcher.core.spec_decode.ngram_proposer import propose_ngram
from common.protocol import SamplingParams, StructuredOutput
from common.speculative_config import SpeculativeConfig

NGRAM = SpeculativeConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)


def test_longest_suffix_wins_and_the_latest_occurrence() -> None:
    # Suffix [1, 2] occurred at 0 (then 3) and at 5 (then 9); [5, 1, 2] only at 4 (then 9, 7).
    tokens = [1, 2, 3, 0, 5, 1, 2, 9, 7, 5, 1, 2]
    assert propose_ngram(tokens, 1, 3, 2) == [9, 7]
    assert propose_ngram(tokens, 1, 2, 3) == [9, 7, 5]  # latest [1, 2] is at 5


def test_no_match_and_limits() -> None:
    assert propose_ngram([1, 2, 3, 4], 1, 3, 3) == []
    assert propose_ngram([7, 7], 1, 3, 0) == []
    assert propose_ngram([4, 5, 4], 2, 3, 3) == []  # only a 1-gram repeats: below min
    assert propose_ngram([4, 5, 4], 1, 3, 5) == [5, 4]  # what follows, up to the end


def request(params: SamplingParams, output: list[int]) -> Request:
    req = Request(
        req_id="r", prompt_token_ids=[1, 2, 3, 1, 2], sampling_params=params, arrival_time=0.0, entry_id="0-0"
    )
    req.output_token_ids = output
    return req


def test_drafts_respect_budget_max_tokens_and_model_len() -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=100)
    assert propose_drafts(NGRAM, request(greedy, [3]), 64, 512) == [1, 2, 3]
    assert propose_drafts(NGRAM, request(greedy, [3]), 2, 512) == [1]  # budget: the decode + 1 draft
    short = SamplingParams(temperature=0.0, max_tokens=3)
    assert propose_drafts(NGRAM, request(short, [3]), 64, 512) == [1]  # 2 left: one draft and the bonus
    assert propose_drafts(NGRAM, request(greedy, [3]), 64, 8) == [1]  # 6 known of 8 positions
    assert propose_drafts(NGRAM, request(greedy, []), 64, 512) == []  # the first token comes from prefill


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, logprobs=2),
        SamplingParams(temperature=0.7, repetition_penalty=1.1),
        SamplingParams(temperature=0.0, presence_penalty=0.5),
        SamplingParams(temperature=0.0, logit_bias={5: 1.0}),
        SamplingParams(temperature=0.0, min_tokens=2),
        SamplingParams(temperature=0.0, structured_output=StructuredOutput(kind="json_object")),
    ],
)
def test_every_request_drafts_whatever_its_sampling_params(params: SamplingParams) -> None:
    # The worker processes each draft's row as plain decoding would (tests/unit/gpu_worker).
    assert propose_drafts(NGRAM, request(params, [3]), 64, 512) == [1, 2, 3]


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa", "mtp", "nonsense"])
def test_methods_not_built_are_refused_by_name(method: str) -> None:
    with pytest.raises(ValidationError, match=method):
        SpeculativeConfig(method=method, num_speculative_tokens=2)


def test_a_draft_model_comes_with_its_directory_and_a_draft_length() -> None:
    config = SpeculativeConfig(method="draft_model", model="/models/draft", num_speculative_tokens=3)
    assert (config.model, config.num_draft_tokens) == ("/models/draft", 3)
    with pytest.raises(ValidationError, match="model"):
        SpeculativeConfig(method="draft_model", num_speculative_tokens=3)
    with pytest.raises(ValidationError, match="num_speculative_tokens"):
        SpeculativeConfig(method="draft_model", model="/models/draft")
    with pytest.raises(ValidationError, match="model"):
        SpeculativeConfig(method="ngram", model="/models/draft", num_speculative_tokens=3)


def test_lookup_range_is_checked() -> None:
    with pytest.raises(ValidationError, match="prompt_lookup_min"):
        SpeculativeConfig(method="ngram", num_speculative_tokens=2, prompt_lookup_min=3, prompt_lookup_max=2)
