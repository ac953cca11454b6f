"""The pooling request kind on the wire: its fields survive a round trip, old messages decode as
generation, and its one result event is what every reader stops at."""

from __future__ import annotations

import struct

import msgspec

from common.protocol import (
    FIELD,
    GenerateRequest,
    NewRequestData,
    PoolingEvent,
    PoolingParams,
    SamplingParams,
    WorkerInfo,
    decode_event,
    decode_request,
    decode_step,
    decode_worker,
    encode,
)
from common.protocol import SchedulerOutput as Step
from common.token_rules import EventFilter, accept_entry

PARAMS = PoolingParams(task="score", activation=False, truncate_prompt_tokens=8)


def test_a_pooling_request_round_trips_and_a_generation_leaves_the_fields_out() -> None:
    msg = GenerateRequest(
        req_id="r",
        prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(),
        arrival_time=1.0,
        pooling_params=PARAMS,
        token_type_ids=[0, 0, 1],
    )
    assert decode_request(encode(msg)) == msg
    # Defaults are left out: an embed request with every default is `{}` on the wire.
    assert msgspec.msgpack.decode(encode(PoolingParams())) == {}
    new = NewRequestData(
        req_id="r",
        prompt_token_ids=[1],
        output_token_ids=[],
        sampling_params=SamplingParams(max_tokens=0),
        block_ids=[0],
        num_computed_tokens=0,
        attempt=1,
        pooling_params=PARAMS,
        token_type_ids=[0],
    )
    step = Step(
        step_id=1,
        scheduled_new_reqs=[new],
        scheduled_cached_reqs=[],
        num_scheduled_tokens={"r": 1},
        total_num_scheduled_tokens=1,
        finished_req_ids=[],
    )
    assert decode_step(encode(step)) == step


def test_a_worker_says_which_runner_it_is_and_an_old_one_generates() -> None:
    old = WorkerInfo(worker_id="w", model="m", num_blocks=8, block_size=16, max_model_len=128, started_at=1.0)
    info = msgspec.structs.replace(
        old,
        runner="pooling",
        pooling_tasks=["embed"],
        chunked_prefill=False,
        prefix_caching=False,
        embed_dim=32,
        is_matryoshka=True,
        matryoshka_dimensions=[8, 16],
    )
    assert decode_worker(encode(info)) == info
    assert decode_worker(encode(old)).runner == "generate"


def test_the_pooling_event_carries_float32_values_and_ends_the_stream_for_readers() -> None:
    data = struct.pack("<3f", 0.5, -1.0, 2.25)
    event = PoolingEvent(req_id="r", attempt=2, data=data, num_prompt_tokens=7, num_cached_tokens=4)
    decoded = decode_event(encode(event))
    assert decoded == event and isinstance(decoded, PoolingEvent)
    assert decoded.values() == [0.5, -1.0, 2.25]
    reader = EventFilter()
    assert accept_entry(reader, "r", "1-0", {FIELD: encode(event)}) == event
    stale = PoolingEvent(req_id="r", attempt=1, data=data, num_prompt_tokens=7)
    assert accept_entry(reader, "r", "2-0", {FIELD: encode(stale)}) is None
