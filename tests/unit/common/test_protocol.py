"""Every message survives an encode/decode round trip, and decoders reject what is not theirs."""

from __future__ import annotations

import msgspec
import pytest

from common.finish import check_finish
from common.protocol import (
    AbortRequest,
    CachedRequestData,
    GenerateRequest,
    ModelRunnerOutput,
    NewRequestData,
    RequestError,
    SamplingParams,
    SchedulerOutput,
    TokenEvent,
    WorkerInfo,
    decode_event,
    decode_inbox,
    decode_request,
    decode_step,
    decode_worker,
    encode,
)
from tests.unit.batcher.test_scheduler import worker

PARAMS = SamplingParams(max_tokens=7, temperature=0.5, top_p=0.9, top_k=5, seed=3, stop_token_ids=[2])
FULL_PARAMS = SamplingParams(
    min_p=0.05,
    presence_penalty=0.5,
    frequency_penalty=-0.5,
    repetition_penalty=1.2,
    logit_bias={7: -100.0, 300: 2.5},
    min_tokens=3,
    logprobs=5,
)


def test_request_round_trip() -> None:
    msg = GenerateRequest(
        req_id="r",
        prompt_token_ids=[1, 2, 3],
        sampling_params=PARAMS,
        arrival_time=1.5,
        priority=1,
        owner="k",
        user="alice",
    )
    assert decode_request(encode(msg)) == msg
    full = GenerateRequest(req_id="f", prompt_token_ids=[1], sampling_params=FULL_PARAMS, arrival_time=0.0)
    assert decode_request(encode(full)) == full


def test_step_round_trip() -> None:
    new = NewRequestData(
        req_id="a",
        prompt_token_ids=[1, 2],
        output_token_ids=[9],
        sampling_params=PARAMS,
        block_ids=[4, 5],
        num_computed_tokens=0,
        attempt=2,
    )
    cached = CachedRequestData(req_id="b", new_block_ids=[7], num_computed_tokens=16)
    msg = SchedulerOutput(
        step_id=3,
        scheduled_new_reqs=[new],
        scheduled_cached_reqs=[cached],
        num_scheduled_tokens={"a": 3, "b": 1},
        total_num_scheduled_tokens=4,
        finished_req_ids=["c"],
    )
    assert decode_step(encode(msg)) == msg


@pytest.mark.parametrize(
    "msg",
    [
        ModelRunnerOutput(
            step_id=1,
            worker_id="w",
            req_ids=["a", "b"],
            sampled_token_ids=[5, 6],
            finish_reasons=[None, "length"],
            req_errors={"c": "bad token"},
            num_scheduled_tokens=4,
            step_time=0.01,
        ),
        AbortRequest(req_id="a", reason="stop"),
        WorkerInfo(worker_id="w", model="m", num_blocks=8, block_size=16, max_model_len=128, started_at=1.0),
    ],
)
def test_inbox_round_trip(msg: msgspec.Struct) -> None:
    assert decode_inbox(encode(msg)) == msg


def test_event_and_worker_round_trip() -> None:
    token = TokenEvent(req_id="a", index=3, token_id=9, attempt=2, finish_reason="stop")
    error = RequestError(req_id="a", message="boom", code="invalid_request")
    assert decode_event(encode(token)) == token
    assert decode_event(encode(error)) == error
    info = worker(
        "w", num_blocks=8, block_size=16, max_len=128, max_num_seqs=256, max_num_batched_tokens=8192
    )
    assert decode_worker(encode(info)) == info


def test_worker_info_without_step_limits_decodes_with_the_old_batcher_limits() -> None:
    # A worker from before the limits were registered: it was scheduled at 64 requests, 512 tokens.
    old = msgspec.msgpack.encode(
        {
            "type": "hello",
            "worker_id": "w",
            "model": "m",
            "num_blocks": 8,
            "block_size": 16,
            "max_model_len": 128,
            "started_at": 1.0,
        }
    )
    info = decode_worker(old)
    assert (info.max_num_seqs, info.max_num_batched_tokens) == (64, 512)
    assert isinstance(decode_inbox(old), WorkerInfo)


def test_token_event_with_logprobs_round_trip_and_stays_compact() -> None:
    token = TokenEvent(
        req_id="a",
        index=0,
        token_id=9,
        attempt=0,
        logprob=-0.25,
        top_token_ids=[9, 4],
        top_logprobs=[-0.25, -1.5],
    )
    assert decode_event(encode(token)) == token
    # Without logprobs the defaults are left out of the encoding, so plain events stay small.
    plain = TokenEvent(req_id="a", index=0, token_id=9, attempt=0)
    assert b"logprob" not in encode(plain) and b"finish_reason" not in encode(plain)
    assert decode_event(encode(plain)) == plain


def test_decoders_refuse_foreign_messages() -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_step(encode(AbortRequest(req_id="a")))
    with pytest.raises(msgspec.DecodeError):
        decode_event(b"\xff\x00garbage")


def test_finish_rules() -> None:
    p = SamplingParams(max_tokens=3, stop_token_ids=[7])
    assert check_finish(2, 1, 10, p, eos_token_ids={2}, max_model_len=100) == "stop"
    assert check_finish(2, 1, 10, SamplingParams(ignore_eos=True), {2}, 100) is None
    assert check_finish(7, 1, 10, p, {2}, 100) == "stop"
    assert check_finish(5, 3, 10, p, {2}, 100) == "length"
    assert check_finish(5, 1, 100, p, {2}, 100) == "length"
    assert check_finish(5, 1, 10, p, {2}, 100) is None
