"""Drafts with async scheduling: a fake worker that verifies drafts against a deterministic model and
checks every step's positions against its own tokens gets the same greedy tokens with and without
drafts, sync or async; drafts are made, and steps with nothing to draft keep pipelining."""

from __future__ import annotations

from dataclasses import dataclass, field

from batcher.core.request import Request
from batcher.core.scheduler import Scheduler, SchedulerConfig
from common.protocol import FinishReason, ModelRunnerOutput, SamplingParams, SchedulerOutput, WorkerInfo
from common.speculative_config import SpeculativeConfig

NGRAM = SpeculativeConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_max=3)


def model(tokens: list[int]) -> int:
    """Greedy next token: the last one's successor in a cycle of five, so outputs loop and drafts
    predict them, with a skip at every 13th position that rejects some."""
    return 10 + (tokens[-1] - 9 + (len(tokens) % 13 == 0)) % 5


def greedy(prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(model(tokens))
    return tokens[len(prompt) :]


@dataclass
class FakeWorker:
    """Runs steps in order as the real worker does: each step's positions must follow its own tokens."""

    max_tokens: dict[str, int]
    tokens: dict[str, list[int]] = field(default_factory=dict)
    computed: dict[str, int] = field(default_factory=dict)  # positions whose KV is computed
    prompt_len: dict[str, int] = field(default_factory=dict)

    def run(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for new in out.scheduled_new_reqs:
            self.tokens[new.req_id] = [*new.prompt_token_ids, *new.output_token_ids]
            self.prompt_len[new.req_id] = len(new.prompt_token_ids)
            self.computed[new.req_id] = new.num_computed_tokens
        for cached in out.scheduled_cached_reqs:
            assert cached.num_computed_tokens == self.computed[cached.req_id], "a step at the wrong position"
        req_ids: list[str] = []
        sampled: list[int] = []
        reasons: list[FinishReason | None] = []
        accepted: dict[str, list[int]] = {}
        for req_id, n in out.num_scheduled_tokens.items():
            tokens, drafts = self.tokens[req_id], out.scheduled_spec_decode_tokens.get(req_id, [])
            self.computed[req_id] += n - len(drafts)
            if self.computed[req_id] < len(tokens):
                continue  # a prefill chunk that leaves part of the prompt
            assert self.computed[req_id] == len(tokens), "computed past the known tokens"
            run: list[int] = []
            for draft in drafts:
                token = model(tokens + run)
                run.append(token)
                if token != draft:
                    break
            else:
                run.append(model(tokens + run))
            self.computed[req_id] += len(run) - 1  # the accepted drafts; the last token is computed next
            tokens += run
            num_out = len(tokens) - self.prompt_len[req_id]
            assert num_out <= self.max_tokens[req_id]
            req_ids.append(req_id)
            sampled.append(run[-1])
            reasons.append("length" if num_out == self.max_tokens[req_id] else None)
            if len(run) > 1:
                accepted[req_id] = run[:-1]
        return ModelRunnerOutput(
            step_id=out.step_id,
            worker_id="w",
            req_ids=req_ids,
            sampled_token_ids=sampled,
            finish_reasons=reasons,
            accepted_draft_token_ids=accepted,
        )


PROMPTS = {
    "a": [11, 12, 13, 11, 12, 13, 11],
    "b": [14, 10, 16, 14, 10],
    "c": [12, 12, 15, 16, 10, 11, 13, 14, 12, 12],
    "d": [16, 15],
}
MAX_TOKENS = {"a": 40, "b": 25, "c": 33, "d": 18}


def scheduler(config: SchedulerConfig) -> Scheduler:
    s = Scheduler(config)
    s.add_worker(
        WorkerInfo(worker_id="w", model="m", num_blocks=64, block_size=4, max_model_len=128, started_at=0.0)
    )
    return s


def run(config: SchedulerConfig, off: bool = False) -> tuple[dict[str, list[int]], Scheduler, int]:
    """Every request to the end on one worker, as many steps in flight as the config allows; the
    outputs, the scheduler and the most steps that were in flight together. `off`: the worker's
    speculation starts turned off, as after a stretch of traffic its drafts did not pay for."""
    s = scheduler(config)
    gate = s.workers["w"].auto_off
    if off and gate is not None:
        gate.off = True
    done: dict[str, Request] = {}
    for req_id, prompt in PROMPTS.items():
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS[req_id])
        s.add_request(Request(req_id, list(prompt), params, 0.0, f"{req_id}-0"), now=0.0)
    fake = FakeWorker(dict(MAX_TOKENS))
    in_flight: list[SchedulerOutput] = []
    most = 0
    for _ in range(1000):
        while len(in_flight) < config.max_steps_in_flight:
            out, failed = s.schedule("w")
            assert not failed
            if out is None:
                break
            in_flight.append(out)
        most = max(most, len(in_flight))
        if not in_flight:
            break
        for req in s.update_from_output(fake.run(in_flight.pop(0))):
            done[req.req_id] = req
    assert set(done) == set(PROMPTS) and not s.requests
    return {r: done[r].output_token_ids for r in PROMPTS}, s, most


def expected() -> dict[str, list[int]]:
    return {r: greedy(p, MAX_TOKENS[r]) for r, p in PROMPTS.items()}


def test_greedy_tokens_are_the_same_sync_or_async_with_or_without_drafts() -> None:
    for async_scheduling in (False, True):
        for speculative in (None, NGRAM):
            config = SchedulerConfig(
                max_num_batched_tokens=16, async_scheduling=async_scheduling, speculative=speculative
            )
            got, s, _ = run(config)
            assert got == expected(), (async_scheduling, speculative)
            if speculative is not None:
                assert s.stats.spec_decode_num_accepted_tokens > 0


def test_async_drafts_save_steps_and_steps_with_nothing_to_draft_keep_pipelining() -> None:
    config = SchedulerConfig(max_num_batched_tokens=16, async_scheduling=True, speculative=NGRAM)
    _, plain, _ = run(SchedulerConfig(max_num_batched_tokens=16, async_scheduling=True))
    got, s, most = run(config)
    assert got == expected()
    assert s.stats.spec_decode_num_drafts > 0 and s.stats.num_steps < plain.stats.num_steps
    # Prompt chunks, and outputs that have not repeated yet, have nothing to wait for.
    assert most == 2


def test_a_worker_whose_speculation_is_off_pipelines_every_request() -> None:
    off = NGRAM.model_copy(update={"disable_by_batch_size": 1})
    got, s, most = run(SchedulerConfig(max_num_batched_tokens=16, async_scheduling=True, speculative=off))
    assert got == expected() and s.stats.spec_decode_num_drafts == 0 and most == 2


def test_a_request_whose_drafts_are_in_flight_waits_for_their_result() -> None:
    s = scheduler(SchedulerConfig(max_num_batched_tokens=16, async_scheduling=True, speculative=NGRAM))
    fake = FakeWorker(dict(MAX_TOKENS))
    s.add_request(
        Request("a", PROMPTS["a"], SamplingParams(temperature=0.0, max_tokens=40), 0.0, "a-0"), now=0.0
    )
    prefill, _ = s.schedule("w")
    assert prefill is not None
    s.update_from_output(fake.run(prefill))
    drafting, _ = s.schedule("w")
    assert drafting is not None and drafting.scheduled_spec_decode_tokens.get("a")
    # Its worker's speculation turns off while the drafts are out: "a" would neither draft nor wait
    # to, but how many drafts it accepts decides where its next token goes.
    gate = s.workers["w"].auto_off
    assert gate is not None
    gate.max_batch_size = 1
    assert s.schedule("w") == (None, [])
    s.update_from_output(fake.run(drafting))
    after, _ = s.schedule("w")
    assert after is not None and after.num_scheduled_tokens == {"a": 1}
    fake.run(after)  # at the position the worker expects


def test_with_async_scheduling_a_worker_turned_off_probes_and_turns_back_on() -> None:
    config = SchedulerConfig(max_num_batched_tokens=16, async_scheduling=True, speculative=NGRAM)
    got, s, _ = run(config, off=True)
    gate = s.workers["w"].auto_off
    assert got == expected() and gate is not None and not gate.off
    assert s.stats.spec_decode_num_accepted_tokens > 0
