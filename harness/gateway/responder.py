"""A stand-in worker for gateway tests that only need requests to finish: answers every request.

A thread reads each GenerateRequest from the requests stream and writes `num_tokens` token events to
its token stream (with logprobs when asked, as the worker would), the last one finishing it (a
finishing prompt event for max_tokens 0; a pooling request's one result), and keeps a worker heartbeat
fresh so /health says 200.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from common.protocol import (
    FIELD,
    GenerateRequest,
    PoolingEvent,
    PromptEvent,
    TokenEvent,
    decode_request,
    encode,
)
from common.redis_io.ended_streams import announce_end
from common.streams import REQUESTS_STREAM, WORKERS_HEARTBEAT, token_stream

TOKEN_ID = 300


class Responder:
    def __init__(self, redis_url: str, num_tokens: int = 2) -> None:
        self.redis: Any = redis.Redis.from_url(redis_url)
        self._num_tokens = num_tokens
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="responder", daemon=True)
        self.requests: list[GenerateRequest] = []  # every request answered, in order

    def _run(self) -> None:
        last_id = "0-0"
        while not self._stop.is_set():
            self.redis.zadd(WORKERS_HEARTBEAT, {"responder": int(time.time() * 1000)})
            reply = self.redis.xread({REQUESTS_STREAM: last_id}, block=100)
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    last_id = entry_id.decode()
                    self._answer(decode_request(fields[FIELD]))

    def _answer(self, request: GenerateRequest) -> None:
        self.requests.append(request)
        if request.pooling_params is not None:
            result = PoolingEvent(
                req_id=request.req_id,
                attempt=1,
                data=struct.pack("<4f", 0.5, 0.5, 0.5, 0.5),
                num_prompt_tokens=len(request.prompt_token_ids),
            )
            pipe = self.redis.pipeline(transaction=True)
            pipe.xadd(token_stream(request.req_id), {FIELD: encode(result)})
            announce_end(pipe, request.req_id)
            pipe.execute()
            return
        params = request.sampling_params
        n = min(self._num_tokens, params.max_tokens)
        k = params.logprobs
        pipe = self.redis.pipeline(transaction=True)
        event: PromptEvent | TokenEvent
        if n == 0:  # max_tokens 0 ends at the prompt, as the worker ends it
            event = PromptEvent(
                req_id=request.req_id, attempt=1, token_ids=request.prompt_token_ids, finish_reason="length"
            )
            pipe.xadd(token_stream(request.req_id), {FIELD: encode(event)})
        for index in range(n):
            event = TokenEvent(
                req_id=request.req_id,
                index=index,
                token_id=TOKEN_ID,
                attempt=1,
                finish_reason="length" if index == n - 1 else None,
                logprob=None if k is None else -0.5,
                top_token_ids=[] if k is None else [TOKEN_ID + i for i in range(k)],
                top_logprobs=[] if k is None else [-0.5 - i for i in range(k)],
            )
            pipe.xadd(token_stream(request.req_id), {FIELD: encode(event)})
        announce_end(pipe, request.req_id)
        pipe.execute()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.redis.close()


@contextmanager
def responding(redis_url: str, num_tokens: int = 2) -> Iterator[Responder]:
    responder = Responder(redis_url, num_tokens)
    responder.start()
    try:
        yield responder
    finally:
        responder.stop()
