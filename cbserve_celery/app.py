"""The Celery app: cbserve's Redis as broker and result backend, JSON only, a `generate` task, an
`embed` task (cbserve_celery/embedding.py) and the Batch API's `run_batch` (batch_task.py).

Worker crashes: `task_acks_late` acknowledges a task only when it returns, and
`task_reject_on_worker_lost` puts it back on the queue when the process running it dies (instead of
failing it), so a crashed worker's tasks run again elsewhere; the broker's `visibility_timeout` hands
on a task whose whole worker vanished, about that long after its last delivery heartbeat
(cbserve_celery/visibility.py). Running twice is safe (cbserve_celery/generation.py). A task
that *fails* (the request failed or timed out) is acknowledged and not retried: the failure is final.
"""

from __future__ import annotations

import threading
from typing import Any, cast

import redis
from celery import Celery, Task
from celery.signals import worker_ready, worker_shutdown

from cbserve_celery.batch_reaper import BatchReaper
from cbserve_celery.batch_task import add_batch_task
from cbserve_celery.conversation import conversation_prompt, is_conversation
from cbserve_celery.embedding import add_embed_task
from cbserve_celery.generation import parse_sampling_params, run_generation, task_req_id
from cbserve_celery.model_tokenizers import ModelTokenizers
from cbserve_celery.settings import CelerySettings
from cbserve_celery.visibility import DeliveryHeartbeat
from common.redis_io.periodic import Periodic
from common.redis_io.redis_conn import connect
from openai_frontend.model.lora_registry import read_adapter

GENERATE_TASK = "cbserve.generate"


class _Resources:
    """Per worker process, made on first use (after the prefork pool forked): Redis and the tokenizers
    (the `tokenizers` library alone, no transformers / torch)."""

    def __init__(self, settings: CelerySettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._redis: redis.Redis | None = None
        self.tokenizers = ModelTokenizers(settings.model, settings.models_file)

    def redis(self) -> redis.Redis:
        with self._lock:
            if self._redis is None:
                self._redis = connect(self._settings.redis_url, self._settings.redis_cluster)
            return self._redis


def output_text(tokenizer: Any, prompt_token_ids: list[int], token_ids: list[int], finish_reason: str) -> str:
    """The text the gateway would answer for these tokens (same detokenizer, EOS / stop token hidden)."""
    from openai_frontend.text.output_processor import OutputProcessor

    processor = OutputProcessor(tokenizer, prompt_token_ids, [])
    last = len(token_ids) - 1
    return "".join(
        processor.process(token_id, finish_reason if i == last else None).text
        for i, token_id in enumerate(token_ids)
    )


def _start_worker_threads(app: Celery, settings: CelerySettings) -> None:
    """In a worker, from ready to shutdown: heartbeats for the deliveries it holds (visibility.py), and
    the batch reaper (batch_reaper.py)."""
    threads: list[Periodic] = []

    @worker_ready.connect(weak=False)
    def start(**_: Any) -> None:
        threads.append(DeliveryHeartbeat(connect(settings.redis_url), settings.visibility_heartbeat_s))
        threads.append(BatchReaper(app, settings.redis_url, settings.batch_reap_interval_s))
        for thread in threads:
            thread.start()

    @worker_shutdown.connect(weak=False)
    def stop(**_: Any) -> None:
        for thread in threads:
            thread.stop()


def make_app(settings: CelerySettings) -> Celery:
    app = Celery("cbserve", broker=settings.redis_url, backend=settings.redis_url)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            # Look for the tasks of vanished workers a few times per visibility timeout (kombu's
            # default sweep is every 100 s), so they come back soon after it runs out.
            "unacked_restore_interval": max(1.0, min(10.0, settings.visibility_timeout_s / 4)),
            "unacked_restore_throttle": 1,
        },
        # With late acks a worker should not hold tasks it has not started: another worker may be idle.
        worker_prefetch_multiplier=1,
        result_expires=settings.result_expires_s,
        # A result written while Redis is away waits for it: raised instead, it escapes the pool, the
        # request is never finished, and the delivery heartbeat would keep its message held for good.
        result_backend_always_retry=True,
        result_backend_max_sleep_between_retries_ms=2000,
        broker_connection_retry_on_startup=True,
    )
    resources = _Resources(settings)
    _start_worker_threads(app, settings)

    # shared=False: Celery's default registers a task in every app made later in the process, and the
    # first app's closure (its Redis, its tokenizers) would then run for all of them.
    @app.task(name=GENERATE_TASK, bind=True, shared=False)
    def generate(
        self: Task,
        prompt: list[int] | str | list[dict[str, Any]],
        sampling_params: dict[str, Any] | None = None,
        model: str | None = None,
    ) -> dict[str, Any]:
        """Generate for `prompt` (token ids; text, or a conversation of chat messages, images among
        them for a vision-language model, when the worker has the model's files) with `model`: a base
        model of the worker's models config (None: the worker's one, or first), or a LoRA adapter the
        gateways serve (`--lora-modules`, /v1/load_lora_adapter), on its base model.

        Returns {"req_id", "token_ids", "text" (None without a tokenizer), "finish_reason"}.
        """
        adapter = None
        if model is not None and not resources.tokenizers.knows(model):
            adapter = read_adapter(resources.redis(), model)
            if adapter is None:
                known = "in this worker's CBSERVE_CELERY_MODELS_CONFIG nor a loaded adapter"
                raise ValueError(f"model {model!r} is neither {known}")
            base = adapter.base_model_name
            if not resources.tokenizers.runs(base):
                raise ValueError(f"adapter {model!r} runs on {base!r}, not in CBSERVE_CELERY_MODELS_CONFIG")
            model = base if resources.tokenizers.knows(base) else None
        tokenizer = resources.tokenizers.tokenizer(model)
        mm_features = None
        if isinstance(prompt, str) or is_conversation(prompt):
            model_dir = resources.tokenizers.model_dir(model)
            if tokenizer is None or model_dir is None:
                raise ValueError("text prompts need CBSERVE_CELERY_MODEL (or MODEL) on the worker")
            if isinstance(prompt, str):
                prompt_token_ids = tokenizer.encode(prompt, add_special_tokens=True)
            else:
                vision = resources.tokenizers.vision(model_dir)
                chat = conversation_prompt(cast(list[dict[str, Any]], prompt), model_dir, tokenizer, vision)
                prompt_token_ids, mm_features = chat.token_ids, chat.mm_features
        else:
            prompt_token_ids = [int(t) for t in cast(list[int], prompt)]
        # A model's cells (the first model's without `model`); each run of the task places it alike.
        req_id = task_req_id(str(self.request.id), resources.tokenizers.cells(model) or [settings.cell])
        token_ids, finish_reason = run_generation(
            resources.redis(),
            req_id,
            prompt_token_ids,
            parse_sampling_params(sampling_params),
            timeout_s=settings.request_timeout_s,
            mm_features=mm_features,
            lora_request=None if adapter is None else adapter.lora_request,
        )
        text = output_text(tokenizer, prompt_token_ids, token_ids, finish_reason) if tokenizer else None
        return {"req_id": req_id, "token_ids": token_ids, "text": text, "finish_reason": finish_reason}

    add_embed_task(app, settings, resources.tokenizers, resources.redis)
    add_batch_task(app, settings, resources.tokenizers)
    return app
