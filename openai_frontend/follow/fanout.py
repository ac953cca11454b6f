"""Follows the n requests of one n-choice response as one stream of (choice index, output)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

from openai_frontend.follow.request_follower import FollowPolicy, Output, RequestFollower
from openai_frontend.generate.request import PreparedRequest

_END = object()  # a choice's outputs are exhausted


async def merged_outputs(
    follower: RequestFollower,
    requests: Sequence[PreparedRequest],
    follow: FollowPolicy | None = None,
    final_only: bool = False,
) -> AsyncGenerator[tuple[int, Output | None], None]:
    """Outputs of every choice in arrival order, tagged with the choice index; a failure of any choice
    is raised here. Closing this generator (or failing) closes every choice, which aborts unfinished ones.
    `follow` applies to a single choice; several choices cannot be resumed, so they abort at once.
    `final_only`: each choice's tokens are read once it ended (RequestFollower.outputs).
    """
    if len(requests) == 1:  # the common case needs no tasks
        async with aclosing(follower.outputs(requests[0], follow, final_only)) as outputs:
            async for out in outputs:
                yield 0, out
        return
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def follow_choice(index: int, request: PreparedRequest) -> None:
        try:
            async with aclosing(follower.outputs(request, final_only=final_only)) as outputs:
                async for out in outputs:
                    queue.put_nowait((index, out))
        except Exception as exc:  # handed to the consumer, which raises it
            queue.put_nowait((index, exc))
        else:
            queue.put_nowait((index, _END))

    tasks = [asyncio.create_task(follow_choice(i, r)) for i, r in enumerate(requests)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is _END:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                assert item is None or isinstance(item, Output)
                yield index, item
    finally:
        # Cancelling a follower closes its outputs generator, which sends the abort on its own.
        for task in tasks:
            task.cancel()
