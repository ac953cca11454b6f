"""The commands queued on a pipeline, read before `execute` clears them, and queued again: the writes
a Redis that refuses writes (common/redis_io/redis_refusal.py) did not take are sent again later, in order."""

from __future__ import annotations

from typing import Any

import redis

Command = tuple[tuple[Any, ...], dict[str, Any]]


def queued(pipe: redis.client.Pipeline) -> list[Command]:
    """The commands on `pipe` (a Pipeline, or a ClusterPipeline), in the order `execute` runs them."""
    strategy = getattr(pipe, "_execution_strategy", None)  # redis-py's ClusterPipeline
    if strategy is not None:
        return [(c.args, c.options) for c in strategy.command_queue]
    return [(args, options) for args, options in pipe.command_stack]


def requeue(pipe: redis.client.Pipeline, commands: list[Command]) -> None:
    """Queue `commands` on `pipe` again, before anything queued on it later."""
    for args, options in commands:
        pipe.pipeline_execute_command(*args, **options)
