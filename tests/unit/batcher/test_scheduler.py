"""The scheduler and block manager, driven by hand-built step results (no Redis, no model)."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import pytest

from batcher.core.kv.block_manager import BlockManager
from batcher.core.request import Request, RequestStatus
from batcher.core.scheduler import Scheduler, SchedulerConfig
from common.protocol import FinishReason, ModelRunnerOutput, SamplingParams, SchedulerOutput, WorkerInfo


def worker(
    worker_id: str = "w0",
    num_blocks: int = 64,
    block_size: int = 4,
    max_len: int = 256,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 512,
) -> WorkerInfo:
    return WorkerInfo(
        worker_id=worker_id,
        model="m",
        num_blocks=num_blocks,
        block_size=block_size,
        max_model_len=max_len,
        started_at=0.0,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )


def request(req_id: str, prompt_len: int, max_tokens: int = 8, prompt: list[int] | None = None) -> Request:
    """A request whose prompt shares no block with another id's (unless `prompt` is given)."""
    first = zlib.crc32(req_id.encode()) + 1000
    return Request(
        req_id=req_id,
        prompt_token_ids=prompt if prompt is not None else [first, *range(2, prompt_len + 1)],
        sampling_params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        arrival_time=0.0,
        entry_id=f"{req_id}-entry",
    )


def make(max_num_seqs: int = 8, max_tokens: int = 64, **worker_kw: int) -> Scheduler:
    s = Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_tokens))
    s.add_worker(worker(**worker_kw))  # type: ignore[arg-type]
    return s


def complete(
    s: Scheduler,
    out: SchedulerOutput,
    worker_id: str = "w0",
    finish: Callable[[Request], FinishReason | None] = lambda r: None,
) -> list[Request]:
    """Answer a step as a worker would: a token (100 + output index) for each request whose prompt is done."""
    req_ids, tokens, reasons = [], [], []
    for req_id in out.num_scheduled_tokens:
        req = s.requests.get(req_id)
        if req is None:  # aborted meanwhile: the worker does not know yet and samples anyway
            req_ids.append(req_id)
            tokens.append(0)
            reasons.append(None)
        elif req.num_output_placeholders:  # the step it was sent in ends with a sample
            req_ids.append(req_id)
            tokens.append(100 + len(req.output_token_ids))
            reasons.append(finish(req))
    result = ModelRunnerOutput(
        step_id=out.step_id,
        worker_id=worker_id,
        req_ids=req_ids,
        sampled_token_ids=tokens,
        finish_reasons=reasons,
    )
    return s.update_from_output(result)


def step(s: Scheduler, worker_id: str = "w0", **kw: object) -> SchedulerOutput:
    out, failed = s.schedule(worker_id)
    assert not failed
    assert out is not None
    complete(s, out, worker_id, **kw)  # type: ignore[arg-type]
    return out


def test_block_manager_allocates_and_frees() -> None:
    bm = BlockManager(num_blocks=4, block_size=16)
    assert bm.blocks_for(1) == 1 and bm.blocks_for(16) == 1 and bm.blocks_for(17) == 2
    assert bm.num_new_blocks(held=1, num_tokens=17) == 1
    ids = bm.allocate(3)
    assert len(set(ids)) == 3 and bm.num_free_blocks == 1
    with pytest.raises(RuntimeError):
        bm.allocate(2)
    bm.free(ids)
    assert bm.num_free_blocks == 4 and bm.usage == 0.0


def test_admission_respects_token_budget_and_chunks_the_remainder() -> None:
    s = make(max_tokens=32)
    for i in range(4):
        s.add_request(request(f"r{i}", prompt_len=10), now=0.0)
    out, _ = s.schedule("w0")
    assert out is not None
    assert out.num_scheduled_tokens == {"r0": 10, "r1": 10, "r2": 10, "r3": 2}
    assert out.total_num_scheduled_tokens == 32
    assert [r.req_id for r in out.scheduled_new_reqs] == ["r0", "r1", "r2", "r3"]
    assert s.stats.num_partial_prefills == 1
    complete(s, out)
    # r0..r2 sampled their first token; r3 sampled nothing and continues its prompt while they decode.
    assert [len(s.requests[f"r{i}"].output_token_ids) for i in range(4)] == [1, 1, 1, 0]
    out2, _ = s.schedule("w0")
    assert out2 is not None
    assert out2.num_scheduled_tokens == {"r0": 1, "r1": 1, "r2": 1, "r3": 8}
    assert not out2.scheduled_new_reqs
    cached = {c.req_id: c.num_computed_tokens for c in out2.scheduled_cached_reqs}
    assert cached == {"r0": 10, "r1": 10, "r2": 10, "r3": 2}


def test_long_prompt_spreads_over_steps_while_decodes_continue() -> None:
    s = make(max_tokens=16)
    s.add_request(request("short", prompt_len=4, max_tokens=20), now=0.0)
    step(s)
    s.add_request(request("long", prompt_len=40), now=0.0)
    seen = []
    while len(s.requests["long"].output_token_ids) == 0:
        out = step(s)
        assert out.num_scheduled_tokens["short"] == 1  # the decode never waits for the prefill
        seen.append(out.num_scheduled_tokens["long"])
    assert seen == [15, 15, 10]


def test_max_num_seqs_caps_the_batch() -> None:
    s = make(max_num_seqs=2)
    for i in range(3):
        s.add_request(request(f"r{i}", prompt_len=3), now=0.0)
    out = step(s)
    assert set(out.num_scheduled_tokens) == {"r0", "r1"}
    assert [r.req_id for r in s.waiting] == ["r2"]


def test_finished_request_is_freed_and_dropped_on_the_worker_next_step() -> None:
    s = make()
    s.add_request(request("a", prompt_len=5, max_tokens=2), now=0.0)
    s.add_request(request("b", prompt_len=5, max_tokens=9), now=0.0)
    step(s)
    free_before = s.workers["w0"].kv_cache_manager.num_free_blocks
    out, _ = s.schedule("w0")
    assert out is not None
    finished = complete(s, out, finish=lambda r: "length" if r.req_id == "a" else None)
    assert [r.req_id for r in finished] == ["a"]
    assert finished[0].status is RequestStatus.FINISHED and finished[0].output_token_ids == [100, 101]
    assert s.workers["w0"].kv_cache_manager.num_free_blocks == free_before + 2
    out2, _ = s.schedule("w0")
    assert out2 is not None and out2.finished_req_ids == ["a"]
    assert set(out2.num_scheduled_tokens) == {"b"}


def test_preemption_frees_the_newest_and_recomputes_it_later() -> None:
    # 6 blocks of 4 tokens: two requests of 8 prompt tokens take 4 blocks; growing needs more.
    s = make(num_blocks=6, block_size=4)
    s.add_request(request("old", prompt_len=8, max_tokens=12), now=0.0)
    s.add_request(request("new", prompt_len=8, max_tokens=12), now=0.0)
    for _ in range(5):
        step(s)
    assert s.stats.num_preemptions == 0
    # Both hold 12 tokens' worth (3 blocks each); the next token needs a fourth block for each.
    out, _ = s.schedule("w0")
    assert out is not None
    assert s.stats.num_preemptions == 1
    assert set(out.num_scheduled_tokens) == {"old"}
    assert out.finished_req_ids == ["new"]  # the worker drops it in this very step
    victim = s.requests["new"]
    assert victim.status is RequestStatus.WAITING and victim.num_computed_tokens == 0
    assert s.waiting[0] is victim
    generated = list(victim.output_token_ids)
    complete(s, out)
    out2, _ = s.schedule("w0")
    assert out2 is not None and set(out2.num_scheduled_tokens) == {"old"}  # still no room for "new"
    # Once "old" finishes, "new" comes back as a new request with its tokens so far and a new attempt.
    complete(s, out2, finish=lambda r: "length")
    out3, _ = s.schedule("w0")
    assert out3 is not None
    assert out3.finished_req_ids == ["old"]
    [resumed] = out3.scheduled_new_reqs
    assert resumed.req_id == "new" and resumed.output_token_ids == generated
    # Its prompt's full blocks stayed cached while it waited: only the rest is recomputed.
    assert resumed.attempt == 2 and resumed.num_computed_tokens == 8
    assert out3.num_scheduled_tokens["new"] == len(generated)


def test_abort_frees_running_and_remembers_early_aborts() -> None:
    s = make()
    s.add_request(request("a", prompt_len=4), now=0.0)
    step(s)
    aborted = s.abort_request("a", "abort", now=0.0)
    assert aborted is not None and aborted.finish_reason == "abort"
    assert s.workers["w0"].kv_cache_manager.num_free_blocks == 64
    assert s.schedule("w0")[0] is None  # nothing left to compute; the free rides on the next step
    assert s.abort_request("later", "stop", now=1.0) is None
    [early] = s.add_request(request("later", prompt_len=4), now=2.0)
    assert early.finish_reason == "stop" and "later" not in s.requests


def test_result_of_an_aborted_request_is_ignored() -> None:
    s = make()
    s.add_request(request("a", prompt_len=4), now=0.0)
    out, _ = s.schedule("w0")
    assert out is not None
    s.abort_request("a", "abort", now=0.0)
    assert complete(s, out) == []
    assert not s.workers["w0"].in_flight


def test_request_larger_than_every_pool_fails() -> None:
    s = make(num_blocks=4, block_size=4)
    s.add_request(request("huge", prompt_len=10, max_tokens=20), now=0.0)
    out, failed = s.schedule("w0")
    assert out is None
    assert [r.req_id for r in failed] == ["huge"] and failed[0].finish_reason == "error"
    assert "blocks" in (failed[0].error or "")


def test_new_requests_are_split_between_workers_by_free_blocks() -> None:
    s = make(max_num_seqs=16)
    s.add_worker(worker("w1"))
    for i in range(8):
        s.add_request(request(f"r{i}", prompt_len=4), now=0.0)
    out0, _ = s.schedule("w0")
    out1, _ = s.schedule("w1")
    assert out0 is not None and out1 is not None
    assert len(out0.scheduled_new_reqs) == 4 and len(out1.scheduled_new_reqs) == 4
    # A single new request goes to the worker with more free blocks, not the one asking first.
    complete(s, out0)
    complete(s, out1, worker_id="w1")
    s.abort_request("r0", "abort", now=0.0)  # w0 now has more free blocks
    s.add_request(request("next", prompt_len=4), now=0.0)
    out1b, _ = s.schedule("w1")
    assert out1b is not None and not out1b.scheduled_new_reqs
    out0b, _ = s.schedule("w0")
    assert out0b is not None and [r.req_id for r in out0b.scheduled_new_reqs] == ["next"]


def _at_max_tokens(req: Request) -> FinishReason | None:
    return "length" if len(req.output_token_ids) + 1 >= req.sampling_params.max_tokens else None


def run_to_completion(s: Scheduler, worker_ids: list[str]) -> dict[str, list[SchedulerOutput]]:
    """Step every worker in turn until no request is left; the steps each one got."""
    steps: dict[str, list[SchedulerOutput]] = {w: [] for w in worker_ids}
    for _ in range(200):
        if not s.requests:
            return steps
        for worker_id in worker_ids:
            out, failed = s.schedule(worker_id)
            assert not failed
            if out is not None:
                steps[worker_id].append(out)
                complete(s, out, worker_id, finish=_at_max_tokens)
    raise AssertionError(f"requests left after 200 rounds: {sorted(s.requests)}")


def test_workers_of_different_sizes_each_get_steps_within_their_own_limits() -> None:
    s = Scheduler(SchedulerConfig())  # no batcher caps: the registered limits rule
    s.add_worker(worker("cpu", max_num_seqs=2, max_num_batched_tokens=8))
    s.add_worker(worker("gpu", max_num_seqs=6, max_num_batched_tokens=40))
    for i in range(24):
        s.add_request(request(f"r{i}", prompt_len=6, max_tokens=4), now=0.0)
    steps = run_to_completion(s, ["gpu", "cpu"])
    biggest = {
        w: (max(len(o.num_scheduled_tokens) for o in outs), max(o.total_num_scheduled_tokens for o in outs))
        for w, outs in steps.items()
    }
    # Each filled its own limits and never went past them; both served requests.
    assert biggest == {"cpu": (2, 8), "gpu": (6, 36)}


def test_batcher_limits_cap_what_workers_register() -> None:
    s = Scheduler(SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=10))
    s.add_worker(worker("small", max_num_seqs=2, max_num_batched_tokens=8))
    s.add_worker(worker("big", max_num_seqs=256, max_num_batched_tokens=8192))
    for i in range(12):
        s.add_request(request(f"r{i}", prompt_len=6, max_tokens=4), now=0.0)
    steps = run_to_completion(s, ["big", "small"])
    assert max(len(o.num_scheduled_tokens) for o in steps["big"]) == 3
    assert max(o.total_num_scheduled_tokens for o in steps["big"]) == 10
    assert max(len(o.num_scheduled_tokens) for o in steps["small"]) == 2
    assert max(o.total_num_scheduled_tokens for o in steps["small"]) == 8


def test_dead_worker_requests_resume_on_another_worker() -> None:
    s = make()
    s.add_request(request("a", prompt_len=4, max_tokens=10), now=0.0)
    step(s)
    step(s)
    s.add_worker(worker("w1"))
    assert [r.req_id for r in s.remove_worker("w0")] == ["a"]
    out, _ = s.schedule("w1")
    assert out is not None
    [resumed] = out.scheduled_new_reqs
    assert resumed.output_token_ids == [100, 101] and resumed.attempt == 2
    # A late result from the dead worker changes nothing.
    late = ModelRunnerOutput(
        step_id=3, worker_id="w0", req_ids=["a"], sampled_token_ids=[9], finish_reasons=[None]
    )
    assert s.update_from_output(late) == []
    assert s.requests["a"].output_token_ids == [100, 101]


def tgi(max_num_seqs: int = 32, max_tokens: int = 64, max_waiting_tokens: int = 20) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_tokens,
        scheduling_policy="tgi",
        waiting_served_ratio=0.3,
        max_waiting_tokens=max_waiting_tokens,
    )
    s = Scheduler(config)
    s.add_worker(worker(num_blocks=256))
    return s


def test_tgi_prefills_whole_prompts_in_steps_of_their_own() -> None:
    s = tgi(max_tokens=16)
    s.add_request(request("long", prompt_len=50, max_tokens=30), now=0.0)
    out = step(s)
    assert out.num_scheduled_tokens == {"long": 50}  # no chunking, even over the budget
    assert s.stats.num_partial_prefills == 0
    s.add_request(request("next", prompt_len=5), now=0.0)
    out = step(s)
    # floor(1 * 0.3) == 0: any new request is enough, and its prefill step carries no decode.
    assert out.num_scheduled_tokens == {"next": 5}


def test_tgi_waits_for_enough_new_requests_then_admits_them_together() -> None:
    s = tgi()
    for i in range(10):
        s.add_request(request(f"r{i}", prompt_len=4, max_tokens=100), now=0.0)
    step(s)  # all ten prefilled together
    s.add_request(request("a", prompt_len=4), now=0.0)
    s.add_request(request("b", prompt_len=4), now=0.0)
    out = step(s)
    assert set(out.num_scheduled_tokens) == {f"r{i}" for i in range(10)}  # 2 < floor(10 * 0.3): decode
    s.add_request(request("c", prompt_len=4), now=0.0)
    out = step(s)
    assert out.num_scheduled_tokens == {"a": 4, "b": 4, "c": 4}  # 3 fit: a prefill-only step
    out = step(s)
    assert len(out.num_scheduled_tokens) == 13 and set(out.num_scheduled_tokens.values()) == {1}


def test_tgi_admits_a_lone_request_after_max_waiting_tokens() -> None:
    s = tgi(max_waiting_tokens=5)
    for i in range(10):
        s.add_request(request(f"r{i}", prompt_len=4, max_tokens=100), now=0.0)
    step(s)
    s.add_request(request("lone", prompt_len=4), now=0.0)
    decodes = 0
    while "lone" not in step(s).num_scheduled_tokens:
        decodes += 1
    assert decodes == 4  # steps_since_admission counts 1 (the prefill) + 4 decodes = 5


class FakeWorker:
    """Answers steps the way gpu_worker does (own token counts, finishes at max_tokens), no model."""

    def __init__(self, worker_id: str = "w0") -> None:
        self.worker_id = worker_id
        self.known: dict[str, int] = {}  # tokens the worker knows per request
        self.computed: dict[str, int] = {}
        self.outputs: dict[str, list[int]] = {}
        self.max_tokens: dict[str, int] = {}
        self.done: set[str] = set()

    def run(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for req_id in out.finished_req_ids:
            for table in (self.known, self.computed, self.outputs, self.max_tokens):
                table.pop(req_id, None)
            self.done.discard(req_id)
        for new in out.scheduled_new_reqs:
            self.known[new.req_id] = len(new.prompt_token_ids) + len(new.output_token_ids)
            self.computed[new.req_id] = new.num_computed_tokens
            self.outputs[new.req_id] = list(new.output_token_ids)
            self.max_tokens[new.req_id] = new.sampling_params.max_tokens
        for cached in out.scheduled_cached_reqs:
            if cached.req_id not in self.done:
                assert cached.num_computed_tokens == self.computed[cached.req_id]
        req_ids, tokens, reasons = [], [], []
        for req_id, n in out.num_scheduled_tokens.items():
            if req_id in self.done:
                continue  # sent once more before the batcher heard it finished
            self.computed[req_id] += n
            assert self.computed[req_id] <= self.known[req_id]
            if self.computed[req_id] == self.known[req_id]:
                token = 100 + len(self.outputs[req_id])
                self.outputs[req_id].append(token)
                self.known[req_id] += 1
                reason: FinishReason | None = None
                if len(self.outputs[req_id]) >= self.max_tokens[req_id]:
                    reason = "length"
                    self.done.add(req_id)
                req_ids.append(req_id)
                tokens.append(token)
                reasons.append(reason)
        return ModelRunnerOutput(
            step_id=out.step_id,
            worker_id=self.worker_id,
            req_ids=req_ids,
            sampled_token_ids=tokens,
            finish_reasons=reasons,
        )


def run_async(s: Scheduler, fake: FakeWorker, max_steps: int = 500) -> list[Request]:
    """Drive one worker, with as many steps in flight as the config allows, until all finished."""
    finished: list[Request] = []
    in_flight: list[SchedulerOutput] = []
    for _ in range(max_steps):
        while len(in_flight) < s.config.max_steps_in_flight:
            out, failed = s.schedule(fake.worker_id)
            assert not failed
            if out is None:
                break
            in_flight.append(out)
        if not in_flight:
            return finished
        finished += s.update_from_output(fake.run(in_flight.pop(0)))
    raise AssertionError("did not finish")


def test_async_scheduling_sends_the_next_step_before_the_result() -> None:
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16, async_scheduling=True))
    s.add_worker(worker())
    s.add_request(request("a", prompt_len=4, max_tokens=3), now=0.0)
    s.add_request(request("b", prompt_len=20, max_tokens=3), now=0.0)
    first, _ = s.schedule("w0")
    second, _ = s.schedule("w0")
    assert first is not None and second is not None
    assert first.num_scheduled_tokens == {"a": 4, "b": 12}
    # "a" decodes the token step 1 is sampling; "b" continues its prompt.
    assert second.num_scheduled_tokens == {"a": 1, "b": 8}
    assert {c.req_id: c.num_computed_tokens for c in second.scheduled_cached_reqs} == {"a": 4, "b": 12}


def test_async_scheduling_gives_the_same_tokens_with_preemption_and_finishes() -> None:
    def run(async_scheduling: bool) -> dict[str, list[int]]:
        config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16, async_scheduling=async_scheduling)
        s = Scheduler(config)
        s.add_worker(worker(num_blocks=10, block_size=4))
        for i, (n, m) in enumerate([(4, 9), (7, 5), (12, 8), (3, 1), (9, 7)]):
            s.add_request(request(f"r{i}", prompt_len=n, max_tokens=m), now=0.0)
        done = run_async(s, FakeWorker())
        assert not s.requests and s.workers["w0"].kv_cache_manager.num_free_blocks == 10
        if async_scheduling:
            assert s.stats.num_preemptions > 0
        return {r.req_id: r.output_token_ids for r in done}

    expected = {f"r{i}": [100 + j for j in range(m)] for i, m in enumerate([9, 5, 8, 1, 7])}
    assert run(False) == expected
    assert run(True) == expected


def test_async_scheduling_skips_a_request_its_in_flight_step_finishes() -> None:
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16, async_scheduling=True))
    s.add_worker(worker())
    s.add_request(request("one", prompt_len=4, max_tokens=1), now=0.0)
    s.add_request(request("more", prompt_len=4, max_tokens=5), now=0.0)
    s.schedule("w0")
    second, _ = s.schedule("w0")
    assert second is not None and set(second.num_scheduled_tokens) == {"more"}


def test_fenced_worker_gets_no_steps_but_its_last_results_count() -> None:
    s = make()
    s.add_worker(worker("w1"))
    for i in range(4):
        s.add_request(request(f"r{i}", prompt_len=4, max_tokens=10), now=0.0)
    on_w0, _ = s.schedule("w0")
    assert on_w0 is not None and on_w0.num_scheduled_tokens  # w0 took its share
    s.fence_worker("w0")
    assert s.schedule("w0") == (None, [])
    # Its result written before the fence still arrives (ahead of the WorkerLost marker) and counts.
    complete(s, on_w0, "w0")
    moved = s.remove_worker("w0")
    assert {r.req_id for r in moved} == set(on_w0.num_scheduled_tokens)
    out, _ = s.schedule("w1")
    assert out is not None
    assert {n.req_id: n.output_token_ids for n in out.scheduled_new_reqs} == {
        r.req_id: [100] for r in moved
    } | {rid: [] for rid in ("r0", "r1", "r2", "r3") if rid not in on_w0.num_scheduled_tokens}
    assert s.stats.num_workers_lost == 1 and s.stats.num_failovers == len(moved)


def test_request_preempted_during_a_step_of_a_dead_worker_is_not_stuck() -> None:
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16, async_scheduling=True))
    s.add_worker(worker(num_blocks=3, block_size=4))
    s.add_request(request("a", prompt_len=4), now=0.0)
    s.add_request(request("b", prompt_len=4), now=0.0)
    s.schedule("w0")
    # Both decodes need a new block and one is left: "b" is preempted while step 1 runs.
    s.schedule("w0")
    assert [r.req_id for r in s.waiting] == ["b"] and s.requests["b"].num_inflight_steps == 1
    s.add_worker(worker("w1", num_blocks=8, block_size=4))
    s.remove_worker("w0")  # step 1's result will never come
    out, _ = s.schedule("w1")
    assert out is not None and [n.req_id for n in out.scheduled_new_reqs] == ["a", "b"]


def test_request_failing_alone_is_retried_then_given_up() -> None:
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_deliveries=3))
    s.add_worker(worker())
    s.add_request(request("ok", prompt_len=4, max_tokens=10), now=0.0)
    s.add_request(request("bad", prompt_len=4, max_tokens=10), now=0.0)
    attempts = []
    for delivery in range(1, 4):
        out, _ = s.schedule("w0")
        assert out is not None and "bad" in out.num_scheduled_tokens
        attempts += [n.attempt for n in out.scheduled_new_reqs if n.req_id == "bad"]
        result = ModelRunnerOutput(
            step_id=out.step_id,
            worker_id="w0",
            req_ids=["ok"],
            sampled_token_ids=[100 + delivery - 1],
            finish_reasons=[None],
            req_errors={"bad": "boom"},
        )
        finished = s.update_from_output(result)
        assert [r.req_id for r in finished] == ([] if delivery < 3 else ["bad"])
    assert attempts == [1, 2, 3]  # each retry is a fresh attempt, recomputed from scratch
    [bad] = finished
    assert bad.finish_reason == "error" and bad.dead_letter and "3 deliveries" in (bad.error or "")
    assert s.requests["ok"].output_token_ids == [100, 101, 102]  # its batch went on
    assert (s.stats.num_retries, s.stats.num_dead_lettered) == (2, 1)
