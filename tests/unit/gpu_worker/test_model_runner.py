"""ModelRunner against the real tiny model: continuous batching must not change a single greedy token."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers.masking_utils import create_causal_mask

from benchmarks.gpu.gpu_parity import reference_greedy
from common.protocol import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SamplingParams,
)
from gpu_worker.runner.attention.torch_attn import TorchAttentionBackend
from gpu_worker.runner.model_runner import ModelRunner
from gpu_worker.settings import WorkerSettings
from harness.gpu_worker.worker_steps import new_request, prefill_step, scheduler_output

# The tiny model's greedy continuation of this prompt is [461, 0, 257, 0, ...]: EOS (0) mid-stream.
EOS_PROMPT = [462, 383, 46, 427, 255, 274, 170, 352]
BLOCK_SIZE = 4  # small blocks so requests span many, exercising block-table reads
NUM_BLOCKS = 96


@pytest.fixture(scope="module", autouse=True)
def _few_threads() -> None:
    torch.set_num_threads(1)


@pytest.fixture(params=[True, False], ids=["grouped-decodes", "one-decode-group"])
def runner(tiny_model_dir: Path, request: pytest.FixtureRequest) -> ModelRunner:
    # Both attention layouts: decodes in groups of similar length (the cpu default) and all in one.
    return make_runner(tiny_model_dir, seed=0, group_decodes=request.param)


def make_runner(model_dir: Path, **settings: Any) -> ModelRunner:
    """A runner of the tiny model with this file's small pool; `settings` add to or override it."""
    defaults = {
        "model": str(model_dir),
        "num_blocks": NUM_BLOCKS,
        "block_size": BLOCK_SIZE,
        "worker_id": "test",
    }
    return ModelRunner(WorkerSettings(**(defaults | settings)))


def generate_alone(model_dir: Path, prompt: list[int], num_tokens: int) -> list[int]:
    """Plain transformers, one request alone, EOS never special: what every batched run must equal."""
    return reference_greedy(model_dir, [prompt], num_tokens)[0]


@dataclass
class SimRequest:
    """The batcher's view of one request in this hand-rolled scheduler."""

    req_id: str
    prompt: list[int]
    params: SamplingParams
    arrival_step: int
    outputs: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    on_worker: bool = False
    attempt: int = 0
    done: bool = False

    @property
    def num_known(self) -> int:
        return len(self.prompt) + len(self.outputs)


class SimScheduler:
    """Decodes first, then prefills chunked to a token budget; blocks from a free list."""

    def __init__(self, runner: ModelRunner, token_budget: int) -> None:
        self.runner = runner
        self.token_budget = token_budget
        self.free_blocks = list(range(NUM_BLOCKS))
        self.to_free: list[str] = []
        self.step_id = 0

    def release(self, req: SimRequest) -> None:
        self.free_blocks.extend(req.blocks)
        req.blocks = []
        self.to_free.append(req.req_id)

    def preempt(self, req: SimRequest) -> None:
        self.release(req)
        req.num_computed, req.on_worker, req.attempt = 0, False, req.attempt + 1

    def step(self, requests: list[SimRequest]) -> ModelRunnerOutput:
        active = [r for r in requests if not r.done and r.arrival_step <= self.step_id]
        active.sort(key=lambda r: (r.num_known - r.num_computed != 1 or not r.on_worker, r.arrival_step))
        new, cached, scheduled, budget = [], [], {}, self.token_budget
        for req in active:
            num = min(req.num_known - req.num_computed, budget)
            if num <= 0:
                continue
            needed = -(-(req.num_computed + num) // BLOCK_SIZE) - len(req.blocks)
            fresh = [self.free_blocks.pop(0) for _ in range(needed)]
            req.blocks += fresh
            if req.on_worker:
                cached.append(
                    CachedRequestData(
                        req_id=req.req_id, new_block_ids=fresh, num_computed_tokens=req.num_computed
                    )
                )
            else:
                new.append(
                    new_request(
                        req.req_id,
                        req.prompt,
                        req.params,
                        list(req.blocks),
                        output_token_ids=list(req.outputs),
                        attempt=req.attempt,
                        num_computed_tokens=req.num_computed,
                    )
                )
                req.on_worker = True
            scheduled[req.req_id] = num
            budget -= num
        output = self.runner.execute_model(
            scheduler_output(self.step_id, new, cached, scheduled, self.to_free)
        )
        self.to_free = []
        assert output.req_errors == {}
        self._update(requests, scheduled, output)
        self.step_id += 1
        return output

    def _update(
        self, requests: list[SimRequest], scheduled: dict[str, int], output: ModelRunnerOutput
    ) -> None:
        by_id = {r.req_id: r for r in requests}
        for req_id, num in scheduled.items():
            by_id[req_id].num_computed += num
        events = self.runner.token_events(output)
        for event, reason in zip(events, output.finish_reasons, strict=True):
            req = by_id[event.req_id]
            assert event.index == len(req.outputs) and event.attempt == req.attempt
            req.outputs.append(event.token_id)
            # max_tokens ends the output, as "length" unless its last token is a stop token.
            if len(req.outputs) < req.params.max_tokens:
                assert reason != "length"
            else:
                stops = {*self.runner.eos_token_ids, *req.params.stop_token_ids}
                assert reason == "length" or (reason == "stop" and event.token_id in stops)
            if reason is not None:
                req.done = True
                self.release(req)


def make_requests(params: list[SamplingParams]) -> list[SimRequest]:
    generator = torch.Generator().manual_seed(1)
    prompt_lens = [3, 17, 9, 40, 1, 26, 12, 33, 5, 21, 0]
    arrivals = [0, 0, 1, 2, 2, 4, 6, 7, 9, 12, 3]
    prompts = [torch.randint(3, 500, (n,), generator=generator).tolist() for n in prompt_lens]
    prompts[10] = EOS_PROMPT
    return [
        SimRequest(req_id=f"r{i}", prompt=prompts[i], params=params[i], arrival_step=arrivals[i])
        for i in range(len(params))
    ]


def run_to_completion(
    runner: ModelRunner, requests: list[SimRequest], preempt: dict[int, str], token_budget: int = 24
) -> None:
    scheduler = SimScheduler(runner, token_budget)
    by_id = {r.req_id: r for r in requests}
    while not all(r.done for r in requests):
        target = preempt.get(scheduler.step_id)
        if target is not None:
            assert by_id[target].outputs and not by_id[target].done, "preempt a request that is decoding"
            scheduler.preempt(by_id[target])
        scheduler.step(requests)
        assert scheduler.step_id < 500


def test_batched_greedy_equals_transformers_generate(runner: ModelRunner, tiny_model_dir: Path) -> None:
    max_tokens = [12, 5, 20, 8, 15, 3, 10, 18, 7, 9, 6]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in max_tokens]
    requests = make_requests(params)
    # r3 (40-token prompt) needs two chunks at a 24-token budget; r0 is preempted mid-decode and resumed.
    run_to_completion(runner, requests, preempt={8: "r0"})
    assert requests[0].attempt == 1
    assert 0 in requests[10].outputs, "EOS_PROMPT no longer makes the tiny model emit EOS: pick another"
    for req in requests:
        expected = generate_alone(tiny_model_dir, req.prompt, req.params.max_tokens)
        assert req.outputs == expected, req.req_id


def assert_same_alone(
    runner: ModelRunner, params: list[SamplingParams], batched: list[SimRequest], indexes: tuple[int, ...]
) -> None:
    """Each of the `indexes` requests, run alone from the first step, gets what it got in the batch."""
    for i in indexes:
        alone = make_requests(params)[i : i + 1]
        alone[0].arrival_step = 0
        run_to_completion(runner, alone, preempt={})
        assert alone[0].outputs == batched[i].outputs


def test_seeded_sampling_survives_batching_and_preemption(runner: ModelRunner) -> None:
    params = [SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=200 + i) for i in range(11)]
    batched = make_requests(params)
    run_to_completion(runner, batched, preempt={6: "r1"})
    assert_same_alone(runner, params, batched, (0, 1, 3))


def test_penalties_and_logprobs_survive_batching_and_preemption(runner: ModelRunner) -> None:
    # Penalties read the output so far, which a preempted request gets back from the batcher.
    params = [
        SamplingParams(
            max_tokens=12,
            temperature=0.0 if i % 2 else 0.9,
            seed=7 + i,
            repetition_penalty=1.3,
            frequency_penalty=0.4,
            presence_penalty=0.2 * (i % 3),
            min_tokens=3,
            logprobs=2,
            logit_bias={5: -1.0},
        )
        for i in range(11)
    ]
    batched = make_requests(params)
    run_to_completion(runner, batched, preempt={7: "r0", 9: "r2"})
    assert batched[0].attempt == 1 and batched[2].attempt == 1
    assert_same_alone(runner, params, batched, (0, 2, 5))


def test_token_events_carry_logprobs_only_when_asked(runner: ModelRunner) -> None:
    asked, plain = SamplingParams(temperature=0.0, logprobs=3), SamplingParams(temperature=0.0)
    output = runner.execute_model(
        prefill_step([new_request("a", [5, 6, 7], asked, [0]), new_request("b", [5, 6, 7], plain, [1])])
    )
    with_logprobs, without = runner.token_events(output)
    assert with_logprobs.logprob is not None and len(with_logprobs.top_token_ids) == 3
    assert with_logprobs.top_token_ids[0] == with_logprobs.token_id  # greedy takes the most likely
    assert with_logprobs.logprob == with_logprobs.top_logprobs[0]
    assert without.logprob is None and without.top_token_ids == []


def test_bad_request_fails_alone(runner: ModelRunner) -> None:
    good = new_request("good", [5, 6, 7], SamplingParams(max_tokens=2, temperature=0.0), [0])
    bad = new_request("bad", [5, 10**6], SamplingParams(max_tokens=2), [1])
    output = runner.execute_model(
        scheduler_output(
            0,
            [good, bad],
            [CachedRequestData(req_id="ghost", new_block_ids=[], num_computed_tokens=4)],
            {"good": 3, "bad": 2, "ghost": 1},
        )
    )
    assert output.req_ids == ["good"]
    assert set(output.req_errors) == {"bad", "ghost"}
    assert "vocabulary" in output.req_errors["bad"]


def single_step(runner: ModelRunner, prompt: list[int], params: SamplingParams) -> ModelRunnerOutput:
    blocks = list(range(-(-len(prompt) // BLOCK_SIZE) + 1))
    return runner.execute_model(prefill_step([new_request("s", prompt, params, blocks)]))


def test_stop_token_finishes(runner: ModelRunner, tiny_model_dir: Path) -> None:
    prompt = [11, 12, 13, 14, 15]
    first = generate_alone(tiny_model_dir, prompt, 1)[0]
    output = single_step(
        runner, prompt, SamplingParams(max_tokens=5, temperature=0.0, stop_token_ids=[first])
    )
    assert output.sampled_token_ids == [first]
    assert output.finish_reasons == ["stop"]


def test_eos_finishes_without_ignore_eos(runner: ModelRunner) -> None:
    # Resent as if preempted after its first token, so the next sampled token is the EOS.
    params = SamplingParams(max_tokens=5, temperature=0.0)
    new = new_request("e", EOS_PROMPT, params, [0, 1, 2], output_token_ids=[461], attempt=1)
    output = runner.execute_model(prefill_step([new]))
    assert output.sampled_token_ids == [0]
    assert output.finish_reasons == ["stop"]
    (event,) = runner.token_events(output)
    assert (event.index, event.attempt, event.finish_reason) == (1, 1, "stop")


def test_transformers_builds_no_dense_mask(runner: ModelRunner) -> None:
    # A packed batch (positions restart per request) is where transformers would build a [T, T] mask.
    config = runner.model.config
    mask = create_causal_mask(
        config=config,
        inputs_embeds=torch.zeros(1, 6, config.hidden_size),
        attention_mask=None,
        cache=None,
        position_ids=torch.tensor([[4, 0, 1, 2, 7, 8]]),
    )
    assert mask is None


def test_null_model_samples_token_zero_without_a_forward(tiny_model_dir: Path) -> None:
    null = make_runner(tiny_model_dir, worker_id="n", null_model=True)
    calls: list[int] = []
    null.model.register_forward_hook(lambda *_: calls.append(1))
    out = single_step(null, [5, 6, 7], SamplingParams(max_tokens=1, ignore_eos=True))
    assert out.sampled_token_ids == [0] and out.finish_reasons == ["length"]
    assert calls == []


def test_step_that_raises_is_rerun_request_by_request(tiny_model_dir: Path) -> None:
    """A request that makes the forward raise fails alone; the decodes sharing its step are unchanged."""
    prompts = {"a": [17, 99, 250, 31, 8], "b": [400, 12, 77]}
    num_tokens = 6
    expected = {r: generate_alone(tiny_model_dir, p, num_tokens) for r, p in prompts.items()}
    used = {t for seq in [*prompts.values(), *expected.values()] for t in seq}
    poison = next(t for t in range(3, 512) if t not in used)
    runner = make_runner(tiny_model_dir, fail_on_token_id=poison)
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    # "a" asks for logprobs: they must survive the rerun (each single-request forward resets them).
    with_logprobs = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True, logprobs=1)
    blocks = {"a": [0, 1, 2], "b": [3, 4, 5], "poison": [6]}

    def new(req_id: str, prompt: list[int]) -> NewRequestData:
        asked = with_logprobs if req_id == "a" else params
        return new_request(req_id, prompt, asked, blocks[req_id], attempt=1)

    got: dict[str, list[int]] = {"a": [], "b": []}
    first = runner.execute_model(prefill_step([new(r, p) for r, p in prompts.items()]))
    for r, t in zip(first.req_ids, first.sampled_token_ids, strict=True):
        got[r].append(t)
    for step_id in range(1, num_tokens):
        cached = [
            CachedRequestData(req_id=r, new_block_ids=[], num_computed_tokens=len(p) + step_id - 1)
            for r, p in prompts.items()
        ]
        joins = [new("poison", [poison, 7])] if step_id == 1 else []
        out = runner.execute_model(
            scheduler_output(step_id, joins, cached, {"a": 1, "b": 1} | ({"poison": 2} if joins else {}))
        )
        assert sorted(out.req_ids) == ["a", "b"]
        events = {e.req_id: e for e in runner.token_events(out)}
        assert events["a"].logprob is not None and events["b"].logprob is None
        if joins:
            assert list(out.req_errors) == ["poison"] and "fail_on_token_id" in out.req_errors["poison"]
            assert "poison" not in runner.requests  # dropped: the batcher recomputes it if it retries
        else:
            assert out.req_errors == {}
        for r, t in zip(out.req_ids, out.sampled_token_ids, strict=True):
            got[r].append(t)
    assert got == expected


def test_a_narrower_kv_cache_holds_twice_the_blocks_and_stays_close(tiny_model_dir: Path) -> None:
    """WORKER_KV_CACHE_DTYPE=bfloat16 on a float32 model: the same memory holds twice the blocks,
    decodes read the narrow pool through the CPU kernel, and greedy output stays close to the float32
    pool's (not equal: K/V are rounded to bfloat16)."""
    sizes = {"num_blocks": None, "kv_cache_memory_mb": 1}
    exact = make_runner(tiny_model_dir, **sizes)
    narrow = make_runner(tiny_model_dir, kv_cache_dtype="bfloat16", **sizes)
    assert narrow.model.dtype == torch.float32 and narrow.kv_cache.k_pools[0].dtype == torch.bfloat16
    assert narrow.num_blocks == 2 * exact.num_blocks
    assert isinstance(narrow.attn_backend, TorchAttentionBackend) and narrow.attn_backend.decode_kernel
    max_tokens = [12, 5, 20, 8, 15, 3, 10, 18, 7, 9, 6]
    outputs = []
    for runner in (exact, narrow):
        requests = make_requests(
            [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in max_tokens]
        )
        run_to_completion(runner, requests, preempt={8: "r0"})
        outputs.append([r.outputs for r in requests])
    first_tokens = sum(a[0] == b[0] for a, b in zip(*outputs, strict=True))
    same = sum(a == b for a, b in zip(*outputs, strict=True))
    assert first_tokens == len(max_tokens) and same >= len(max_tokens) - 2, outputs
