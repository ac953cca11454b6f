"""Drafts in the batcher's step: budget, blocks, what counts as computed and cached (hand-built results)."""

from __future__ import annotations

from batcher.core.request import Request
from batcher.core.scheduler import Scheduler, SchedulerConfig
from batcher.service.step_trace import step_trace
from common.protocol import ModelRunnerOutput, SamplingParams, SchedulerOutput, WorkerInfo
from common.speculative_config import SpeculativeConfig

PROMPT = [7, 8, 9, 10, 11, 7, 8, 9]  # with a first output 10, [9, 10] came before: drafts 11, 7, 8


def make(num_blocks: int = 64, budget: int = 64, **spec: int) -> Scheduler:
    config = SpeculativeConfig(method="ngram", num_speculative_tokens=3, **spec)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, speculative=config))
    s.add_worker(
        WorkerInfo(
            worker_id="w", model="m", num_blocks=num_blocks, block_size=4, max_model_len=256, started_at=0.0
        )
    )
    return s


def add(s: Scheduler, req_id: str, prompt: list[int] = PROMPT, max_tokens: int = 20) -> Request:
    req = Request(req_id, list(prompt), SamplingParams(temperature=0.0, max_tokens=max_tokens), 0.0, "0-0")
    s.add_request(req, now=0.0)
    return req


def answer(s: Scheduler, step: SchedulerOutput, tokens: dict[str, list[int]]) -> None:
    """The worker's result: per request its run (accepted drafts, then the sampled token)."""
    s.update_from_output(
        ModelRunnerOutput(
            step_id=step.step_id,
            worker_id="w",
            req_ids=list(tokens),
            sampled_token_ids=[run[-1] for run in tokens.values()],
            finish_reasons=[None] * len(tokens),
            accepted_draft_token_ids={r: run[:-1] for r, run in tokens.items() if len(run) > 1},
        )
    )


def prefill(s: Scheduler, *reqs: Request, first: int = 10) -> None:
    step, _ = s.schedule("w")
    assert step is not None and not step.scheduled_spec_decode_tokens  # a prefill never drafts
    answer(s, step, {r.req_id: [first] for r in reqs})


def test_drafts_take_budget_and_blocks_and_count_once_accepted() -> None:
    s = make()
    req = add(s, "a")
    prefill(s, req)  # known: PROMPT + [10], computed: the prompt
    step, _ = s.schedule("w")
    assert step is not None
    assert step.scheduled_spec_decode_tokens == {"a": [11, 7, 8]}
    assert step.num_scheduled_tokens == {"a": 4}  # the last token and three drafts
    assert len(req.block_ids) == 3  # 12 positions computed in blocks of 4
    assert req.num_computed_tokens == 9  # drafts do not count yet
    answer(s, step, {"a": [11, 7, 5]})  # two accepted, then the model's own token
    assert req.output_token_ids == [10, 11, 7, 5]
    assert req.num_computed_tokens == 11  # ... up to the last accepted draft; 5 is computed next
    assert req.num_cached_blocks * 4 <= req.num_computed_tokens
    assert s.stats.spec_decode_num_drafts == 1
    assert (s.stats.spec_decode_num_draft_tokens, s.stats.spec_decode_num_accepted_tokens) == (3, 2)
    assert s.spec_accepted_per_pos == [1, 1, 0]


def test_the_number_of_drafts_follows_acceptance() -> None:
    s = make()
    req = add(s, "a", [*PROMPT, 10, 11, 7, 8, 9, 10, 11, 7, 8, 9])
    prefill(s, req)  # ... 9, 10: drafts 11, 7, 8
    step, _ = s.schedule("w")
    assert step is not None and step.scheduled_spec_decode_tokens == {"a": [11, 7, 8]}
    answer(s, step, {"a": [7]})  # all rejected: one draft fewer next time
    assert req.num_spec_tokens == 2
    step, _ = s.schedule("w")  # the latest 7 came before 8, 9, 10
    assert step is not None and step.scheduled_spec_decode_tokens == {"a": [8, 9]}
    answer(s, step, {"a": [8, 9, 10]})  # all accepted: two more, up to the setting's 3
    assert req.num_spec_tokens == 3


def test_drafts_take_from_the_budget_of_waiting_prompts() -> None:
    s = make(budget=9)
    req = add(s, "a")
    prefill(s, req)
    add(s, "c", [1, 2, 3, 4, 5, 6, 7])
    step, _ = s.schedule("w")
    assert step is not None and step.scheduled_spec_decode_tokens == {"a": [11, 7, 8]}
    assert step.num_scheduled_tokens == {"a": 4, "c": 5}  # c's prompt is chunked to what is left


def test_drafts_never_preempt() -> None:
    # Three blocks of 4: "a" (6 tokens) holds two, "b" (3) one. a's decode at position 6 fits its
    # second block; drafts at 7-9 would need a fourth block, which only preempting b could give.
    s = make(num_blocks=3)
    a, b = add(s, "a", [7, 8, 9, 10, 7, 8], max_tokens=6), add(s, "b", [1, 2, 3], max_tokens=2)
    prefill(s, a, b, first=9)
    step, _ = s.schedule("w")
    assert step is not None and not step.scheduled_spec_decode_tokens
    assert step.num_scheduled_tokens == {"a": 1, "b": 1}
    assert s.stats.num_preemptions == 0


def test_no_drafts_from_the_batch_size_set() -> None:
    s = make(disable_by_batch_size=2)
    a, b = add(s, "a"), add(s, "b", [1, *PROMPT])
    prefill(s, a, b)
    step, _ = s.schedule("w")
    assert step is not None and not step.scheduled_spec_decode_tokens
    s2 = make(disable_by_batch_size=2)
    c = add(s2, "c")
    prefill(s2, c)
    step2, _ = s2.schedule("w")
    assert step2 is not None and step2.scheduled_spec_decode_tokens


def test_the_dashboards_trace_shows_a_drafting_decode_as_a_decode() -> None:
    s = make()
    req = add(s, "a")
    prefill(s, req)
    step, _ = s.schedule("w")
    assert step is not None and step.scheduled_spec_decode_tokens == {"a": [11, 7, 8]}
    [traced] = step_trace(s.workers["w"], step, num_waiting=0, now=0.0).reqs
    assert (traced.kind, traced.num_tokens) == ("d", 4)  # the last token and three drafts
