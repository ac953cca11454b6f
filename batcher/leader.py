"""Active or standby: a batcher process schedules only while it holds the lease (batcher/lease.py).

Any number of batcher processes may run; one holds the lease and serves, the others poll for it.
Each time a process takes the lease it builds a fresh `Batcher`, which rebuilds its state from Redis
(batcher/recovery.py); a process that loses the lease drops all its state and stands by again.
"""

from __future__ import annotations

import logging
import threading

import redis

from batcher.lease import Lease, LeaseLost, lease_holder
from batcher.service import Batcher
from batcher.settings import BatcherSettings

log = logging.getLogger("batcher")


def serve(settings: BatcherSettings, client: redis.Redis, stop: threading.Event) -> None:
    lease = Lease(client, settings.batcher_id, settings.lease_ttl_s)
    waiting_logged = False
    try:
        while not stop.is_set():
            if not lease.acquire():
                if not waiting_logged:
                    log.info("batcher %s on standby; active: %s", settings.batcher_id, lease_holder(client))
                    waiting_logged = True
                stop.wait(settings.standby_poll_s)
                continue
            waiting_logged = False
            log.info("batcher %s took the lease (epoch %d)", settings.batcher_id, lease.epoch)
            try:
                Batcher(settings, client, lease).run(stop)
            except LeaseLost as e:
                log.warning("%s: stepping down to standby", e)
    finally:
        lease.release()
