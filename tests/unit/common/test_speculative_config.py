"""SPECULATIVE_CONFIG as the batcher and `cbserve up --speculative-config` read it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from batcher.settings import BatcherSettings
from cbserve.launcher import LaunchError, check_speculative_config

NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}'


def test_the_batcher_reads_vllms_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECULATIVE_CONFIG", NGRAM)
    config = BatcherSettings().speculative_config
    assert config is not None
    assert (config.method, config.num_speculative_tokens, config.prompt_lookup_max) == ("ngram", 3, 2)


def test_async_scheduling_takes_model_free_drafts_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECULATIVE_CONFIG", NGRAM)
    monkeypatch.setenv("BATCHER_ASYNC_SCHEDULING", "true")
    assert BatcherSettings().async_scheduling
    draft = '{"method": "draft_model", "num_speculative_tokens": 3, "model": "m"}'
    monkeypatch.setenv("SPECULATIVE_CONFIG", draft)
    with pytest.raises(ValidationError, match="BATCHER_ASYNC_SCHEDULING"):
        BatcherSettings()


def test_the_launcher_refuses_what_the_services_would() -> None:
    check_speculative_config(NGRAM)
    check_speculative_config(None)
    check_speculative_config('{"method": "draft_model", "num_speculative_tokens": 3, "model": "m"}')
    with pytest.raises(LaunchError, match="eagle3"):
        check_speculative_config('{"method": "eagle3", "num_speculative_tokens": 3, "model": "m"}')
    with pytest.raises(LaunchError, match="speculative-config"):
        check_speculative_config("{not json")
