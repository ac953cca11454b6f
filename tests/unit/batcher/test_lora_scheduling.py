"""LoRA requests in the scheduler (batcher/core/lora.py, placement.py, policies/): at most `max_loras`
adapters per worker's step without holding back base-model requests, adapter-keyed prefix blocks,
placement on a worker that holds the adapter, a clear failure where no worker serves adapters, and
the adapter kept through preemption and failover. Hand-built steps, no Redis, no model."""

from __future__ import annotations

import msgspec

from batcher.core.kv.prefix_cache import block_hashes
from batcher.core.lora import NO_LORA_WORKER, holds_adapter
from batcher.core.placement import best_worker
from batcher.core.request import Request
from batcher.core.scheduler import Scheduler, SchedulerConfig
from batcher.core.scheduler_state import SchedulingPolicyName
from common.protocol import GenerateRequest, LoRARequest, SchedulerOutput, WorkerInfo
from tests.unit.batcher.test_scheduler import complete, request, worker

ADAPTERS = {name: LoRARequest(lora_name=name, lora_path=f"/adapters/{name}") for name in "ABC"}
PROMPT = list(range(500, 516))  # 4 blocks of 4 tokens


def lora_worker(worker_id: str = "w0", max_loras: int = 2, max_cpu_loras: int = 0, **kw: int) -> WorkerInfo:
    info = worker(worker_id, **kw)
    return msgspec.structs.replace(info, max_loras=max_loras, max_lora_rank=16, max_cpu_loras=max_cpu_loras)


def lora(req_id: str, adapter: str | None, prompt: list[int] | None = None, max_tokens: int = 8) -> Request:
    req = request(req_id, prompt_len=6, max_tokens=max_tokens, prompt=prompt)
    req.lora_request = None if adapter is None else ADAPTERS[adapter]
    return req


def make(*infos: WorkerInfo, policy: SchedulingPolicyName = "fused", weight: float = 1.0) -> Scheduler:
    s = Scheduler(SchedulerConfig(scheduling_policy=policy, cache_overlap_weight=weight))
    for info in infos:
        s.add_worker(info)
    return s


def adapters_of(s: Scheduler, out: SchedulerOutput) -> set[str]:
    loras = (s.requests[i].lora_request for i in out.num_scheduled_tokens)
    return {lora.lora_name for lora in loras if lora is not None}


def test_a_step_holds_at_most_max_loras_adapters_and_base_requests_go_on() -> None:
    s = make(lora_worker(max_loras=2))
    for req_id, adapter in [("a1", "A"), ("b1", "B"), ("c1", "C"), ("base", None), ("a2", "A")]:
        s.add_request(lora(req_id, adapter), now=0.0)
    out, failed = s.schedule("w0")
    assert out is not None and not failed
    # c1 waits for a slot; the base request and a2 (an adapter already in the step) pass it.
    assert [n.req_id for n in out.scheduled_new_reqs] == ["a1", "b1", "base", "a2"]
    assert [n.lora_request for n in out.scheduled_new_reqs] == [
        ADAPTERS["A"],
        ADAPTERS["B"],
        None,
        ADAPTERS["A"],
    ]
    assert [r.req_id for r in s.waiting] == ["c1"]
    # While A and B run, every step keeps to them; once b1 ends, C takes its slot.
    complete(s, out, finish=lambda r: "stop" if r.req_id == "b1" else None)
    out, _ = s.schedule("w0")
    assert out is not None and [n.req_id for n in out.scheduled_new_reqs] == ["c1"]
    assert adapters_of(s, out) == {"A", "C"}


def test_one_slot_a_base_request_is_never_held_back() -> None:
    policies: list[SchedulingPolicyName] = ["fused", "tgi"]
    for policy in policies:
        s = make(lora_worker(max_loras=1), policy=policy)
        for req_id, adapter in [("a", "A"), ("b", "B"), ("base", None), ("b2", "B")]:
            s.add_request(lora(req_id, adapter), now=0.0)
        out, _ = s.schedule("w0")
        assert out is not None and [n.req_id for n in out.scheduled_new_reqs] == ["a", "base"], policy
        assert [r.req_id for r in s.waiting] == ["b", "b2"], policy


def test_prefix_blocks_are_keyed_by_adapter() -> None:
    same = [lora("x", "A", PROMPT), lora("y", "A", PROMPT), lora("z", "B", PROMPT), lora("w", None, PROMPT)]
    hashes = [block_hashes(req, 4) for req in same]
    assert hashes[0] == hashes[1]
    assert len({tuple(h[0] for h in hashes)} | {hashes[2][0], hashes[3][0]}) == 3  # A, B and the base apart
    s = make(lora_worker(max_loras=2))
    s.add_request(lora("a1", "A", PROMPT), now=0.0)
    first, _ = s.schedule("w0")
    assert first is not None
    complete(s, first)
    for req_id, adapter in [("a2", "A"), ("b", "B"), ("base", None)]:
        s.add_request(lora(req_id, adapter, PROMPT), now=0.0)
    out, _ = s.schedule("w0")
    assert out is not None
    computed = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
    # Only the same adapter reuses a1's blocks (all but the last block: one token is left to compute).
    assert computed == {"a2": 12, "b": 0, "base": 0}


def test_placement_prefers_a_worker_that_holds_the_adapter() -> None:
    s = make(lora_worker("w0", num_blocks=32), lora_worker("w1", num_blocks=32))
    s.add_request(lora("a1", "A"), now=0.0)
    out, _ = s.schedule("w1")  # w1 schedules first and takes it (a tie goes to the worker asking)
    assert out is not None and out.scheduled_new_reqs[0].req_id == "a1"
    w0, w1 = s.workers["w0"], s.workers["w1"]
    assert holds_adapter(w1, s.requests["a1"]) and not holds_adapter(w0, s.requests["a1"])
    a2 = lora("a2", "A")
    # w0 has more free blocks now, but w1 was sent A and has room: A goes there again.
    assert best_worker([w0, w1], a2, prefer=w0, weight=1.0) is w1
    assert best_worker([w0, w1], a2, prefer=w0, weight=0.0) is w1
    s.add_request(a2, now=0.0)
    s.add_request(lora("base", None), now=0.0)
    out0, _ = s.schedule("w0")
    assert out0 is None  # within its share, w0 still leaves a2 to w1 (and base waits behind it)
    complete(s, out, "w1")
    out1, _ = s.schedule("w1")
    assert out1 is not None and [n.req_id for n in out1.scheduled_new_reqs][:1] == ["a2"]
    # Another adapter goes by cost as any request: to w0, with more free blocks.
    assert best_worker([w0, w1], lora("b", "B"), prefer=w1, weight=1.0) is w0


def test_adapters_sent_are_an_lru_of_max_cpu_loras() -> None:
    s = make(lora_worker(max_loras=1, max_cpu_loras=2))
    ws = s.workers["w0"]
    for i, adapter in enumerate("ABCA"):
        s.add_request(lora(f"r{i}", adapter, max_tokens=1), now=0.0)
        out, _ = s.schedule("w0")
        assert out is not None
        complete(s, out, finish=lambda r: "length")
    assert list(ws.adapters_sent) == [ADAPTERS["C"].cache_key, ADAPTERS["A"].cache_key]


def test_no_worker_serving_adapters_fails_the_request_and_base_ones_run() -> None:
    s = make(worker("w0"))  # max_loras 0
    s.add_request(lora("a", "A"), now=0.0)
    s.add_request(lora("base", None), now=0.0)
    out, failed = s.schedule("w0")
    assert [r.req_id for r in failed] == ["a"] and failed[0].error == NO_LORA_WORKER
    assert out is not None and [n.req_id for n in out.scheduled_new_reqs] == ["base"]


def test_a_worker_without_adapters_passes_lora_requests_to_one_with_them() -> None:
    s = make(worker("plain"), lora_worker("lora"))
    s.add_request(lora("a", "A"), now=0.0)
    s.add_request(lora("base", None), now=0.0)
    out, failed = s.schedule("plain")
    assert not failed and out is not None and [n.req_id for n in out.scheduled_new_reqs] == ["base"]
    out, failed = s.schedule("lora")
    assert not failed and out is not None and [n.req_id for n in out.scheduled_new_reqs] == ["a"]


def test_the_adapter_survives_preemption_failover_and_the_dead_letter_copy() -> None:
    s = make(lora_worker("w0", num_blocks=6, max_num_seqs=4))
    for req_id, adapter in [("a", "A"), ("b", "B")]:
        s.add_request(lora(req_id, adapter, max_tokens=12), now=0.0)
    out, _ = s.schedule("w0")
    assert out is not None and len(out.scheduled_new_reqs) == 2
    preempted = False
    while not preempted:  # 6 blocks of 4 tokens: two requests of 6 + 12 tokens cannot both finish
        complete(s, out)
        out, _ = s.schedule("w0")
        assert out is not None
        preempted = bool(s.stats.num_preemptions)
    [victim] = [r for r in s.waiting]
    s.add_worker(lora_worker("w1"))
    s.remove_worker("w0")  # the other one fails over
    for _ in range(2):
        out, _ = s.schedule("w1")
        assert out is not None
        for new in out.scheduled_new_reqs:
            assert new.lora_request == s.requests[new.req_id].lora_request
            assert new.output_token_ids  # recomputed with the tokens it had
        complete(s, out, "w1")
    assert victim.req_id in {"a", "b"}
    message = victim.to_message()
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(message), type=GenerateRequest).lora_request == (
        victim.lora_request
    )
    assert Request.from_message(message, "1-0").lora_request == victim.lora_request


def test_priority_preempts_for_an_adapter_only_when_that_frees_a_slot() -> None:
    s = make(lora_worker(max_loras=1))
    a, base = lora("a", "A"), lora("base", None)
    base.priority = 1
    for req in (a, base):
        s.add_request(req, now=0.0)
    out, _ = s.schedule("w0")
    assert out is not None and len(out.scheduled_new_reqs) == 2
    complete(s, out)
    b = lora("b", "B")  # as urgent as a, whose adapter holds the one slot: preempting base frees none
    s.add_request(b, now=0.0)
    out, _ = s.schedule("w0")
    assert out is not None and not out.scheduled_new_reqs and s.stats.num_preemptions == 0
    complete(s, out)
    a.priority = 1  # now a is less urgent than b: it gives b its slot (base, newer, gives none)
    out, _ = s.schedule("w0")
    assert out is not None and [n.req_id for n in out.scheduled_new_reqs] == ["b"]
    assert out.finished_req_ids == ["a"] and "base" in out.num_scheduled_tokens
    assert s.stats.num_preemptions == 1 and [r.req_id for r in s.waiting] == ["a"]


def test_the_metrics_snapshot_names_running_and_waiting_adapters() -> None:
    from batcher.service.metrics import BatcherMetrics

    s = make(lora_worker(max_loras=2))
    for req_id, adapter in [("a1", "A"), ("b1", "B"), ("c1", "C"), ("base", None)]:
        s.add_request(lora(req_id, adapter), now=0.0)
    s.schedule("w0")
    snapshot = BatcherMetrics(s).snapshot(now=5.0)
    assert (snapshot.running_lora_adapters, snapshot.waiting_lora_adapters) == (["A", "B"], ["C"])
    assert snapshot.max_lora == 2
