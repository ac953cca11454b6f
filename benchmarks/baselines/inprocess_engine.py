"""Our engine in one process (cbserve/offline/engine.py), behind the benchmarks' engine surface.

It is the full pipeline minus Redis, the gateway and the process boundaries, so comparing the two in
one benchmark run isolates what the message queue costs. It offers the same `submit / start / stop /
stats` surface as `StaticBatchEngine`, so `benchmarks.baselines.static_server --engine inprocess` serves it
behind the same HTTP front.
"""

from __future__ import annotations

import logging
import queue

from batcher.core.scheduler import SchedulerStats
from benchmarks.baselines.static_engine import EngineThread, EngineToken, GenerationRequest
from cbserve.offline.engine import LLMEngine
from common.protocol import SamplingParams, TokenEvent

log = logging.getLogger("benchmarks.baselines.inprocess_engine")

_IDLE_POLL_S = 0.05  # how long an idle engine waits for a request before looking at its stop flag


class InProcessEngine(EngineThread):
    def __init__(self, engine: LLMEngine) -> None:
        super().__init__("inprocess-engine")
        self.engine = engine
        self.stats: SchedulerStats = engine.stats
        self._requests: dict[str, GenerationRequest] = {}

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception as exc:  # fail what is pending loudly instead of hanging every client
                log.exception("engine step failed")
                for req_id in list(self._requests):
                    self._emit(req_id, EngineToken(token_id=None, error=f"engine failed: {exc}"))
                self._requests.clear()
                self._stop.set()

    def _step(self) -> None:
        """Receive new requests, run one engine step, publish its tokens."""
        self._receive(block=not self.engine.has_unfinished_requests())
        step = self.engine.step()
        for event in step.events:
            if isinstance(event, TokenEvent):  # benchmarks ask for no prompt events
                self._emit(event.req_id, EngineToken(event.token_id, event.finish_reason))
        for req in step.finished:
            if req.finish_reason == "error":
                self._emit(req.req_id, EngineToken(token_id=None, error=req.error or "request failed"))
            self._requests.pop(req.req_id, None)

    def _receive(self, block: bool) -> None:
        try:
            first = self._waiting.get(timeout=_IDLE_POLL_S) if block else self._waiting.get_nowait()
        except queue.Empty:
            return
        pending = [first]
        while True:
            try:
                pending.append(self._waiting.get_nowait())
            except queue.Empty:
                break
        for gen in pending:
            self._requests[gen.req_id] = gen
            params = SamplingParams(
                max_tokens=gen.max_tokens,
                temperature=gen.temperature,
                seed=gen.seed,
                ignore_eos=gen.ignore_eos,
            )
            self.engine.add_request(gen.req_id, gen.prompt_token_ids, params)

    def _emit(self, req_id: str, event: EngineToken) -> None:
        gen = self._requests.get(req_id)
        if gen is not None:
            gen.emit(event)
