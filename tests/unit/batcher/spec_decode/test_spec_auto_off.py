"""Speculation turns itself off per worker where drafts are rejected, probes, and turns back on."""

from __future__ import annotations

from batcher.core.request import Request
from batcher.core.scheduler import Scheduler, SchedulerConfig
from batcher.core.spec_decode.auto_off import PROBE_INTERVAL, PROBES, WINDOW, AutoOff
from common.protocol import SchedulerOutput, WorkerInfo
from common.speculative_config import SpeculativeConfig
from tests.unit.batcher.spec_decode.test_spec_scheduling import add, answer, prefill

PROMPT = [7, 8, 9, 7, 8, 9]  # every later token is one of these, so the lookup always drafts


def make(**spec: float | int | None) -> Scheduler:
    config = SpeculativeConfig(method="ngram", num_speculative_tokens=2, **spec)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, speculative=config))
    s.add_worker(
        WorkerInfo(worker_id="w", model="m", num_blocks=128, block_size=4, max_model_len=512, started_at=0.0)
    )
    return s


def step(s: Scheduler, req: Request, accept: bool) -> list[int]:
    """One decode: its drafts all accepted (then 9) or the first rejected (a token of the prompt that
    differs from it); returns the drafts sent."""
    out: SchedulerOutput | None
    out, _ = s.schedule("w")
    assert out is not None
    drafts = out.scheduled_spec_decode_tokens.get(req.req_id, [])
    run = [*drafts, 9] if accept else [next(t for t in (7, 8, 9) if not drafts or t != drafts[0])]
    answer(s, out, {req.req_id: run})
    return drafts


def start(s: Scheduler) -> Request:
    req = add(s, "a", PROMPT, max_tokens=400)
    prefill(s, req, first=7)
    return req


def test_rejected_drafts_turn_speculation_off_then_a_probe_turns_it_on() -> None:
    s = make()
    req = start(s)
    for _ in range(WINDOW):
        assert step(s, req, accept=False)  # each decode drafts, and is rejected
    assert s.workers["w"].auto_off is not None and s.workers["w"].auto_off.off
    sent = [step(s, req, accept=False) for _ in range(2 * PROBE_INTERVAL)]
    # Off: one step in PROBE_INTERVAL drafts (a probe), the others decode alone.
    assert [i for i, d in enumerate(sent) if d] == [PROBE_INTERVAL - 1, 2 * PROBE_INTERVAL - 1]
    for _ in range(PROBE_INTERVAL - 1):
        assert not step(s, req, accept=True)
    assert step(s, req, accept=True)  # the probe is accepted: drafting again at every step
    assert all(step(s, req, accept=True) for _ in range(WINDOW))
    assert not s.workers["w"].auto_off.off


def test_acceptance_above_the_rate_keeps_it_on() -> None:
    s = make(disable_by_acceptance_rate=0.3)
    req = start(s)
    # Alternately all accepted (one draft, after a rejection) and all rejected (two, after a step
    # that accepted all): a third of the drafted tokens are accepted.
    assert all(step(s, req, accept=i % 2 == 0) for i in range(3 * WINDOW))


def test_null_rate_never_turns_it_off() -> None:
    s = make(disable_by_acceptance_rate=None)
    req = start(s)
    assert all(step(s, req, accept=False) for _ in range(2 * WINDOW))


def test_the_rate_is_judged_over_the_window_and_the_latest_probes() -> None:
    # A batch of 8, under no batch-size bound: the acceptance alone decides.
    gate = AutoOff(
        SpeculativeConfig(method="suffix", disable_by_acceptance_rate=0.25, disable_by_batch_size=None)
    )
    for _ in range(WINDOW - 1):
        gate.record(4, 0)
    assert not gate.off and gate.num_drafting(8) == 8  # the window is not full yet
    gate.record(4, 0)
    assert gate.off and gate.num_turned_off == 1
    assert [gate.num_drafting(8) for _ in range(PROBE_INTERVAL)] == [0] * (PROBE_INTERVAL - 1) + [1]
    for _ in range(PROBES):
        gate.record(4, 0)
    gate.record(4, 2)  # the latest PROBES probes: 2 of 16 tokens, below the rate
    assert gate.off
    gate.record(4, 4)  # 6 of 16
    assert not gate.off and gate.num_drafting(8) == 8


def test_the_batch_size_turns_it_off_for_the_step_only() -> None:
    gate = AutoOff(SpeculativeConfig(method="suffix", disable_by_batch_size=4))
    assert (gate.num_drafting(4), gate.num_drafting(3)) == (0, 3)
    assert not gate.off


def test_the_next_steps_allowance_is_known_a_step_ahead() -> None:
    # A draft model's drafts are asked for a step before they are sent: while off, the step before
    # each probe asks for one request's, and asking changes nothing.
    gate = AutoOff(SpeculativeConfig(method="ngram", num_speculative_tokens=2))
    for _ in range(WINDOW):
        gate.record(2, 0)
    assert gate.off
    for _ in range(3 * PROBE_INTERVAL):
        ahead = gate.num_drafting_next(4)
        assert gate.num_drafting_next(4) == ahead
        assert gate.num_drafting(4) == ahead
    gate = AutoOff(SpeculativeConfig(method="ngram", num_speculative_tokens=2, disable_by_batch_size=4))
    assert (gate.num_drafting_next(3), gate.num_drafting_next(4)) == (3, 0)


def test_a_probe_stays_due_until_one_is_measured() -> None:
    gate = AutoOff(
        SpeculativeConfig(method="suffix", disable_by_acceptance_rate=0.5, disable_by_batch_size=None)
    )
    gate.off = True
    assert [gate.num_drafting(8) for _ in range(PROBE_INTERVAL + 2)][-3:] == [1, 1, 1]  # none drafted yet
    gate.record(4, 0)  # a probe, rejected
    assert gate.off and gate.num_drafting(8) == 0
