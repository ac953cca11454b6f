"""Pooling requests in the scheduler: in the same steps and token budget as generation, chunked on a
causal model, whole on an encoder, freed after their last prefill step, on pooling workers only."""

from __future__ import annotations

import msgspec

from batcher.core.request import Request, RequestStatus
from batcher.core.scheduler import Scheduler, SchedulerConfig
from common.protocol import GenerateRequest, PoolingParams, SamplingParams, WorkerInfo
from tests.unit.batcher.test_scheduler import complete, request, worker

EMBED = PoolingParams()


def pooling_worker(worker_id: str = "p0", **kw: object) -> WorkerInfo:
    """A pooling worker: `kw` overrides WorkerInfo's pooling fields (chunked_prefill, prefix_caching...)."""
    fields: dict[str, object] = {"runner": "pooling", "pooling_tasks": ["embed"], "embed_dim": 32, **kw}
    return msgspec.structs.replace(worker(worker_id, num_blocks=64, block_size=4), **fields)


def pooling_request(req_id: str, prompt_len: int, params: PoolingParams = EMBED, **kw: object) -> Request:
    message = GenerateRequest(
        req_id=req_id,
        prompt_token_ids=request(req_id, prompt_len).prompt_token_ids,
        sampling_params=SamplingParams(max_tokens=50),  # ignored: a pooling request samples nothing
        arrival_time=0.0,
        pooling_params=params,
        **kw,  # type: ignore[arg-type]
    )
    return Request.from_message(message, f"{req_id}-entry")


def scheduler(*infos: WorkerInfo, budget: int = 16) -> Scheduler:
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget))
    for info in infos:
        s.add_worker(info)
    return s


def run_to_end(s: Scheduler, worker_id: str) -> list[dict[str, int]]:
    """Steps until nothing is scheduled, each answered as the worker does (a pooling request ends
    with its prompt); the tokens each step computed per request."""
    steps = []
    while True:
        out, failed = s.schedule(worker_id)
        assert not failed
        if out is None:
            return steps
        steps.append(dict(out.num_scheduled_tokens))
        complete(s, out, worker_id, finish=lambda r: "length" if r.pooling_params else None)


def test_a_causal_model_pools_a_long_prompt_in_chunks_beside_generation_and_frees_its_blocks() -> None:
    s = scheduler(pooling_worker(), budget=16)
    pooled = pooling_request("p", 40)
    s.add_request(pooled, 0.0)
    s.add_request(pooling_request("q", 6), 0.0)
    steps = run_to_end(s, "p0")
    assert [step.get("p", 0) for step in steps] == [16, 16, 8]  # chunked like any prefill
    assert steps[0].get("q", 0) == 0 and steps[2]["q"] == 6  # in the budget the chunks leave
    assert pooled.status is RequestStatus.FINISHED and pooled.output_token_ids == [100]
    assert not s.requests
    assert s.workers["p0"].kv_cache_manager.num_free_blocks == 64


def test_a_full_prompt_hit_still_computes_its_last_token() -> None:
    s = scheduler(pooling_worker(), budget=64)
    prompt = list(range(3, 19))  # four whole blocks
    first = pooling_request("a", 0)
    first.prompt_token_ids = list(prompt)
    s.add_request(first, 0.0)
    run_to_end(s, "p0")
    again = pooling_request("b", 0)
    again.prompt_token_ids = list(prompt)
    s.add_request(again, 0.0)
    steps = run_to_end(s, "p0")
    assert steps == [{"b": 4}]  # three cached blocks; the last one computed: its hidden state is pooled


def test_mean_pooling_reuses_no_prefix() -> None:
    s = scheduler(pooling_worker(prefix_caching=False), budget=64)
    for req_id in ("a", "b"):
        req = pooling_request(req_id, 0)
        req.prompt_token_ids = list(range(3, 19))
        s.add_request(req, 0.0)
        assert run_to_end(s, "p0") == [{req_id: 16}]


def test_an_encoder_computes_a_prompt_whole_and_refuses_one_over_the_budget() -> None:
    s = scheduler(pooling_worker(chunked_prefill=False, prefix_caching=False), budget=16)
    for req_id, n in (("a", 10), ("b", 10), ("too-long", 17)):
        s.add_request(pooling_request(req_id, n), 0.0)
    out, failed = s.schedule("p0")
    assert out is not None and out.num_scheduled_tokens == {"a": 10}  # b waits for a step with room
    assert [r.req_id for r in failed] == []
    complete(s, out, "p0", finish=lambda r: "length")
    out, failed = s.schedule("p0")
    assert out is not None and out.num_scheduled_tokens == {"b": 10}
    assert [r.req_id for r in failed] == ["too-long"]
    assert failed[0].error is not None and "computes a prompt whole" in failed[0].error


def test_each_kind_goes_to_its_own_worker_of_a_mixed_cell() -> None:
    s = scheduler(worker("g0"), pooling_worker(), budget=64)
    s.add_request(pooling_request("p", 8), 0.0)
    s.add_request(request("g", 8, max_tokens=2), 0.0)
    out, _ = s.schedule("g0")  # the pooling request ahead of it is passed over
    assert out is not None and list(out.num_scheduled_tokens) == ["g"]
    out, _ = s.schedule("p0")
    assert out is not None and list(out.num_scheduled_tokens) == ["p"]
    assert out.scheduled_new_reqs[0].pooling_params == EMBED


def test_a_request_no_worker_of_the_cell_serves_fails_with_the_reason() -> None:
    s = scheduler(worker("g0"))
    s.add_request(pooling_request("p", 4), 0.0)
    _, failed = s.schedule("g0")
    assert failed[0].error == (
        "model 'm' generates text and does not serve embeddings: embed requests need a pooling model"
    )
    assert failed[0].error_code == "invalid_request_error"  # the request's fault: a 400, not a 500

    s = scheduler(pooling_worker())
    s.add_request(request("g", 4), 0.0)
    s.add_request(pooling_request("score", 4, PoolingParams(task="score")), 0.0)
    s.add_request(pooling_request("dims", 4, PoolingParams(dimensions=8)), 0.0)
    _, failed = s.schedule("p0")
    errors = {r.req_id: r.error for r in failed}
    assert errors == {
        "g": "model 'm' is a pooling model (runner pooling, embed): it generates no text",
        "score": "model 'm' serves embed, not score",
        "dims": "model 'm' does not support matryoshka representation: dimensions is not allowed",
    }
    assert {r.error_code for r in failed} == {"invalid_request_error"}


def test_matryoshka_dimensions_are_checked_against_the_models() -> None:
    s = scheduler(pooling_worker(is_matryoshka=True, matryoshka_dimensions=[8, 16]))
    s.add_request(pooling_request("ok", 4, PoolingParams(dimensions=8)), 0.0)
    s.add_request(pooling_request("no", 4, PoolingParams(dimensions=12)), 0.0)
    out, failed = s.schedule("p0")
    assert out is not None and list(out.num_scheduled_tokens) == ["ok"]
    assert [r.error for r in failed] == ["model 'm' supports dimensions [8, 16], not 12"]


def test_truncate_prompt_tokens_keeps_the_last_tokens() -> None:
    kept = pooling_request("k", 10, PoolingParams(truncate_prompt_tokens=4), token_type_ids=[0] * 5 + [1] * 5)
    assert kept.prompt_token_ids == list(range(7, 11)) and kept.token_type_ids == [1] * 4
    s = scheduler(msgspec.structs.replace(pooling_worker(), max_model_len=6))
    whole = pooling_request("w", 10, PoolingParams(truncate_prompt_tokens=-1))
    s.add_request(whole, 0.0)
    out, failed = s.schedule("p0")
    assert not failed and out is not None and out.num_scheduled_tokens == {"w": 6}
    assert whole.prompt_token_ids == list(range(5, 11))
