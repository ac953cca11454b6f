"""Which workers a LoRA request may run on, and which of them already hold its adapter. No I/O.

A worker serves adapters when it registered `max_loras > 0`; one step of it uses at most `max_loras`
distinct adapters (its device slots). The batcher keeps that true by admitting a request for an
adapter only while the worker's running requests use fewer than `max_loras` adapters or already use
this one: every step then holds a subset of them. A request for another adapter waits (the ones
behind it, base-model requests included, are admitted meanwhile); a base-model request is never held
back by adapters. Each worker's adapters are tracked as the batcher sent them (an LRU of the
`max_cpu_loras` the worker keeps in host memory), so placement can prefer a worker that has the
adapter loaded over one that would read it from disk.
"""

from __future__ import annotations

from collections.abc import Iterable

from batcher.core.request import Request
from batcher.core.worker_state import WorkerState

NO_LORA_WORKER = (
    "the request names a LoRA adapter, but no worker serves adapters: start workers with "
    "WORKER_ENABLE_LORA=true (--enable-lora)"
)


def serves_lora(ws: WorkerState, req: Request) -> bool:
    """`ws` can run `req` at all: a base-model request, or a worker that serves adapters."""
    return req.lora_request is None or ws.info.max_loras > 0


def fits_step(ws: WorkerState, req: Request, also: Iterable[Request] = ()) -> bool:
    """Admitting `req` (with `also`, admitted with it) keeps `ws`'s running adapters within `max_loras`."""
    return fits_among([*ws.running, *also], req, ws.info.max_loras)


def fits_among(running: Iterable[Request], req: Request, max_loras: int) -> bool:
    """`req` joining `running` keeps their adapters within `max_loras`."""
    key = req.lora_key
    if key is None:
        return True
    keys = {r.lora_key for r in running} - {None}
    return key in keys or len(keys) < max_loras


def holds_adapter(ws: WorkerState, req: Request) -> bool:
    """`ws` was sent `req`'s adapter lately (so it likely holds it in host memory)."""
    return req.lora_key is not None and req.lora_key in ws.adapters_sent


def note_sent(ws: WorkerState, req: Request) -> None:
    """`req` goes to `ws`: its adapter becomes the worker's most recently used."""
    key = req.lora_key
    if key is None:
        return
    sent = ws.adapters_sent
    sent[key] = None
    sent.move_to_end(key)
    while len(sent) > max(ws.info.max_cpu_loras, ws.info.max_loras, 1):
        sent.popitem(last=False)
